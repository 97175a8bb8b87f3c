"""How a generation looks on the wire, per endpoint: chat completions and (text) completions differ
in their object names, their choice and delta shapes, their logprobs blocks and what a stream opens
with. `Generation` (the request lifecycle) asks its shape and never branches on the kind itself,
so a new response field touches one class here."""
from __future__ import annotations


class Shape:
    """What both endpoints share; subclasses fill in the kind-specific pieces."""

    object_full: str
    object_chunk: str

    def __init__(self, g, tokenizer):
        self.g, self.tok = g, tokenizer

    def piece(self, t: int) -> str:
        return self.tok.decode([t], skip_special=False)

    def logprobs(self, c, items: list) -> dict | None:  # items: (token, logprob, top) per emitted token
        raise NotImplementedError

    def chunk_choice(self, c, text: str, items: list, finish: str | None, first: bool) -> dict:
        raise NotImplementedError

    def full_choice(self, c) -> dict:
        raise NotImplementedError

    def opening(self, c) -> tuple[str, bool] | None:
        """What a stream sends for choice `c` before any token, as (text, first); None: nothing."""
        return None


class ChatShape(Shape):
    object_full, object_chunk = "chat.completion", "chat.completion.chunk"

    def entry(self, t: int, lp: float) -> dict:
        p = self.piece(t)
        return {"token": p, "logprob": lp, "bytes": list(p.encode())}

    def logprobs(self, c, items):
        if c.req.logprobs is None:
            return None
        return {"content": [{**self.entry(t, lp), "top_logprobs": [self.entry(a, b) for a, b in top]}
                            for t, lp, top in items]}

    def chunk_choice(self, c, text, items, finish, first):
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": c.index, "delta": delta, "logprobs": self.logprobs(c, items), "finish_reason": finish}

    def full_choice(self, c):
        return {"index": c.index, "message": {"role": "assistant", "content": c.stream.final_text},
                "logprobs": self.logprobs(c, c.logprobs), "finish_reason": c.finish}

    def opening(self, c):
        return "", True  # the assistant's role, before its first token


class CompletionShape(Shape):
    object_full = object_chunk = "text_completion"

    def prompt_text(self, c) -> str:
        return self.g.prompt_texts[c.index // self.g.n]

    def logprobs(self, c, items):
        if c.req.logprobs is None:
            return None
        return {"tokens": [self.piece(t) for t, _, _ in items], "token_logprobs": [lp for _, lp, _ in items],
                "top_logprobs": [{self.piece(a): b for a, b in top} for _, _, top in items],
                "text_offset": []}

    def chunk_choice(self, c, text, items, finish, first):
        return {"index": c.index, "text": text, "logprobs": self.logprobs(c, items), "finish_reason": finish}

    def full_choice(self, c):
        text = c.stream.final_text
        if self.g.echo:
            text = self.prompt_text(c) + text
        return {"index": c.index, "text": text, "logprobs": self.logprobs(c, c.logprobs), "finish_reason": c.finish}

    def opening(self, c):
        return (self.prompt_text(c), False) if self.g.echo else None


def shape_for(g, tokenizer) -> Shape:
    return (ChatShape if g.kind == "chat" else CompletionShape)(g, tokenizer)
