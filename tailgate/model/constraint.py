"""Token masks from a grammar, for exactly the rows that ask (structured outputs, forced tool calls).

The grammar engine is llguidance (docs/structured-outputs.md says why: it names the JSON-schema
keywords it does not implement instead of ignoring them, has no dependencies, and its mask for the
next token is computed with the GIL dropped, so the executor computes it while the forward pass
runs). Three objects:

- `GrammarBook`: one per served tokenizer; holds llguidance's view of the vocabulary (built once,
  lazily: ~8 s for Gemma's 262k tokens on 2 idle Zen 3 cores, up to 40 s on a loaded host, 1-3 s
  for SmolLM2's 49k) and checks grammars against it.
- `Grammar`: one compiled grammar (a request's `response_format`, `guided_*`, tool schema); plain
  data the engine carries on `SamplingParams.grammar` and never looks into.
- `Constraint`: one request's position in its grammar (an llguidance matcher), owned by the
  executor from the request's first sample until `executor.release`.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

__all__ = ["Constraint", "Grammar", "GrammarBook", "GrammarError", "apply_masks", "book_for"]


class GrammarError(ValueError):
    """A grammar that does not compile, or a JSON schema using a feature the engine does not
    implement; the message names it (the server answers 400)."""


class GrammarBook:
    """llguidance's tokenizer for one of our tokenizers, and the grammars checked against it."""

    def __init__(self, tokenizer_json: str, eos_ids: list[int], vocab_size: int):
        self._json, self.eos_ids, self.vocab_size = tokenizer_json, list(eos_ids), vocab_size
        self._tok = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        """llguidance's LLTokenizer, built on first use (seconds: see the module doc). The server
        asks for it while parsing a request, on a worker thread, never on the engine thread."""
        if self._tok is None:
            with self._lock:
                if self._tok is None:
                    from llguidance import LLTokenizer

                    # EOS as the request will see it: every id the model ends a turn with, so a
                    # grammar that is complete lets the model say so with any of them.
                    self._tok = LLTokenizer(self._json, n_vocab=self.vocab_size, eos_token=self.eos_ids or None)
                    self._json = None
        return self._tok

    def compile(self, grammar: str, what: str) -> "Grammar":
        """A Grammar from llguidance's serialized grammar (`LLMatcher.grammar_from_*`); GrammarError
        naming `what` (e.g. "JSON schema") and llguidance's reason when it does not compile."""
        from llguidance import LLMatcher

        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise GrammarError(f"{what} cannot be enforced: {messages[0] if messages else 'invalid grammar'}")
        proto = LLMatcher(self.tokenizer, grammar, log_level=0)
        if proto.is_error():
            raise GrammarError(f"{what} cannot be enforced: {proto.get_error()}")
        return Grammar(self, proto, what)


_books: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_books_lock = threading.Lock()


def book_for(tokenizer) -> GrammarBook:
    """The GrammarBook of one of our `Tokenizer`s (one per tokenizer object, made on first ask)."""
    with _books_lock:
        book = _books.get(tokenizer)
        if book is None:
            book = _books[tokenizer] = GrammarBook(tokenizer._tok.to_str(), tokenizer.eos_ids, tokenizer.vocab_size)
        return book


class Grammar:
    """A compiled grammar: each request that uses it starts from a copy of the prototype matcher
    (compiling once per request body, not per choice, and never on the engine thread)."""

    __slots__ = ("book", "_proto", "what")

    def __init__(self, book: GrammarBook, proto, what: str):
        self.book, self._proto, self.what = book, proto, what

    def start(self) -> "Constraint":
        return Constraint(self._proto.deep_copy(), self.book)


class Constraint:
    """One request's matcher: the mask for its next token, then the token it drew."""

    __slots__ = ("matcher", "book", "words")

    def __init__(self, matcher, book: GrammarBook):
        self.matcher, self.book = matcher, book
        self.words = (book.vocab_size + 31) // 32

    def fill(self, row: torch.Tensor) -> None:
        """Write the next token's allowed set into `row` (int32, one bit per token id; llguidance
        drops the GIL while it computes)."""
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def advance(self, token: int) -> bool:
        """Take the drawn token; True when the grammar is complete (nothing but EOS may follow), so
        the request ends on this token. An end-of-sequence token ends it anyway (the scheduler's
        stop rule): nothing to take. Raises when the token breaks the grammar (a masked token was
        drawn: a bug, reported on that row only)."""
        if token in self.book.eos_ids:
            return True
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"token {token} breaks the grammar: {self.matcher.get_error()}")
        return self.matcher.is_stopped()


def new_masks(rows: int, vocab_size: int) -> torch.Tensor:
    return torch.zeros(rows, (vocab_size + 31) // 32, dtype=torch.int32)


def apply_masks(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Set every token a row's mask forbids to -inf (rows of `logits` pair with rows of `masks`;
    model vocabulary entries past the tokenizer's are forbidden too). Returns `logits`, edited."""
    vocab = logits.shape[1]
    # One byte per token id (bit j of word w is id 32w+j), flipped in place to 1 = forbidden and
    # read as a bool tensor without a copy: no per-call zeros / casts (those were half of the
    # sampler's time per constrained token on SmolLM2's 49k vocabulary).
    forbid = np.unpackbits(masks.numpy().view(np.uint8), axis=1, bitorder="little")
    forbid ^= 1
    k = min(vocab, forbid.shape[1])
    logits[:, :k].masked_fill_(torch.from_numpy(forbid).view(torch.bool)[:, :k], float("-inf"))
    if vocab > k:
        logits[:, k:] = float("-inf")
    return logits
