"""The request fields that constrain an answer (OpenAI's `response_format`, vLLM's
`structured_outputs` and its older `guided_*` fields) and `logit_bias`, read into what the
sampler enforces: a compiled grammar (`model/constraint.py`) and a per-row bias.

One constraint per request: two fields that each ask for one are refused, as is anything the
grammar engine cannot enforce (the 400 names the keyword), so an answer is never free-form when
its client asked for a shape.
"""

from __future__ import annotations

import json
import weakref

from ..model.constraint import GrammarError, book_for
from .errors import bad

# Compact JSON with the separators json.dumps writes (what a small model has seen most):
# whitespace between tokens would be the model's to choose, and a weak model can loop on it.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
SO_KINDS = ("json", "regex", "choice", "grammar", "json_object")
WHAT = {
    "json": "the JSON schema",
    "regex": "the regex",
    "choice": "the choices",
    "grammar": "the grammar",
    "json_object": "a JSON object",
}
MAX_BIAS_ENTRIES = 300  # OpenAI's documented ceiling for logit_bias


def schema_grammar(schema, param: str) -> str:
    from llguidance import LLMatcher

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise bad(f"'{param}' is not valid JSON", param.split(".")[0]) from None
    if schema is True:  # JSON Schema's "anything"
        schema = {}
    if not isinstance(schema, dict):
        raise bad(f"'{param}' must be a JSON schema (an object; false would match nothing)", param.split(".")[0])
    try:  # as JSON text: llguidance cannot take a Python int past 64 bits (valid JSON, e.g. 1e22 written out)
        return LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise bad(f"'{param}' is not a usable JSON schema: {e}", param.split(".")[0]) from None


def choice_grammar(choices, param: str) -> str:
    from llguidance import LLMatcher

    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise bad(f"'{param}' must be a non-empty list of strings", param.split(".")[0])
    return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))


def text_grammar(kind: str, text, param: str) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if not isinstance(text, str) or not text:
        raise bad(f"'{param}' must be a non-empty string", param.split(".")[0])
    if kind == "regex":
        return LLMatcher.grammar_from_regex(text)
    try:  # Lark as llguidance reads it, or llama.cpp's GBNF (vLLM's guided_grammar examples are EBNF)
        return LLMatcher.grammar_from_lark(any_to_lark(text))
    except Exception as e:
        raise bad(f"'{param}' does not parse as a Lark or GBNF grammar: {e}", param.split(".")[0]) from None


def requested(body: dict) -> tuple[str, str, str] | None:
    """(llguidance grammar, what it is, the field that asked), or None; a 400 for a malformed or
    doubled ask."""
    asks = []
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            raise bad("'response_format.type' must be one of text, json_object, json_schema", "response_format")
        if rf["type"] == "json_object":
            asks.append((schema_grammar({"type": "object"}, "response_format"), "a JSON object", "response_format"))
        elif rf["type"] == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or "schema" not in js:
                raise bad("'response_format.json_schema' must be an object with a 'schema'", "response_format")
            if "name" in js and not isinstance(js["name"], str):
                raise bad("'response_format.json_schema.name' must be a string", "response_format")
            asks.append(
                (
                    schema_grammar(js["schema"], "response_format.json_schema.schema"),
                    "the JSON schema",
                    "response_format",
                )
            )
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("'structured_outputs' must be an object", "structured_outputs")
        # Unset is null or false (0 is a value, not false: /openapi.json says which types go where).
        given = [k for k in SO_KINDS if not _off(so.get(k))]
        unknown = sorted(k for k, v in so.items() if k not in SO_KINDS and not _off(v) and v not in ("", [], {}))
        if unknown:
            raise bad(f"'structured_outputs.{unknown[0]}' is not supported by this server", "structured_outputs")
        if len(given) > 1:
            raise bad(
                f"'structured_outputs' takes one of {', '.join(SO_KINDS)}; got {', '.join(given)}", "structured_outputs"
            )
        if given:
            asks.append(
                (_one(given[0], so[given[0]], f"structured_outputs.{given[0]}"), WHAT[given[0]], "structured_outputs")
            )
    for k in GUIDED:
        if body.get(k) is not None:
            asks.append((_one(k.removeprefix("guided_"), body[k], k), WHAT[k.removeprefix("guided_")], k))
    if len(asks) > 1:
        raise bad(f"one output constraint per request: {', '.join(a[2] for a in asks)} each ask for one", asks[1][2])
    return asks[0] if asks else None


def _off(v) -> bool:
    return v is None or v is False


def _one(kind: str, value, param: str) -> str:
    if kind == "json_object":
        if value is not True:
            raise bad(f"'{param}' must be true", param.split(".")[0])
        return schema_grammar({"type": "object"}, param)
    if kind == "json":
        return schema_grammar(value, param)
    if kind == "choice":
        return choice_grammar(value, param)
    return text_grammar(kind, value, param)


def unwritable(tokenizer) -> str | None:
    """A JSON Schema `pattern` for the strings this tokenizer can write, or None when it writes
    every character. A byte-level BPE vocabulary may lack a byte outright (SmolLM2 has no token
    holding 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, or the UTF-8 lead bytes 0xF1 / 0xF2, so nothing it
    writes holds U+0004 or U+40000..U+BFFFF): a choice holding one can never be answered, and
    llguidance's mask then lets through a token that breaks the grammar (a 500). Declared on the
    choices in /openapi.json (app.py) and refused as a 400 (`check_writable`). Literal characters
    in a negated class: Python's re and the Rust regex schemathesis validates with read it alike."""
    if tokenizer not in _unwritable:  # not book_for's: serializing Gemma's tokenizer for it takes seconds
        missing = [b for b in range(256) if b not in _vocab_bytes(tokenizer)]
        spans = [(b, b) for b in missing if b < 0x80]
        if any(0x80 <= b < 0xC0 for b in missing):  # a continuation byte: sound (not whole) to refuse all non-ASCII
            spans.append((0x80, 0x10FFFF))
        for b in missing:  # a lead byte: every character it starts
            if 0xC2 <= b < 0xE0:
                spans.append(((b & 0x1F) << 6, ((b & 0x1F) << 6) + 0x3F))
            elif 0xE0 <= b < 0xF0:
                spans.append(((b & 0x0F) << 12, ((b & 0x0F) << 12) + 0xFFF))
            elif 0xF0 <= b < 0xF5:
                spans.append(((b & 0x07) << 18, min(0x10FFFF, ((b & 0x07) << 18) + 0x3FFFF)))
        # surrogates cannot reach here (malformed JSON): keep them out of the class
        spans = [(lo, hi) for lo, hi in spans if not (0xD800 <= lo and hi <= 0xDFFF)]
        _unwritable[tokenizer] = (
            "^[^" + "".join(chr(lo) if lo == hi else f"{chr(lo)}-{chr(hi)}" for lo, hi in spans) + "]*$"
            if spans
            else None
        )
    return _unwritable[tokenizer]


_unwritable: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _vocab_bytes(tokenizer) -> set[int]:
    """Every byte some token of the vocabulary holds, read from its entries at C speed (no
    llguidance vocabulary build: /openapi.json asks for this, ~0.1 s for Gemma's 262k entries):
    byte-level BPE spells a byte as one printable character (GPT-2's table), SentencePiece
    pieces are their UTF-8, and a byte-fallback token `<0xXX>` is byte XX."""
    from .token_bytes import _HEX, _byte_level_inverse

    if all(tokenizer._tok.token_to_id(f"<0x{b:02X}>") is not None for b in range(256)):
        return set(range(256))  # byte fallback for every byte (Gemma's): no need to read 262k entries
    text = "\n".join(tokenizer._tok.get_vocab(with_added_tokens=False))
    chars, hexes = set(text), {int(h, 16) for h in _HEX.findall(text)}
    if type(tokenizer._tok.decoder).__name__ == "ByteLevel":
        inverse = _byte_level_inverse()
        return {inverse[c] for c in chars if c in inverse} | hexes
    return {b for c in chars for b in c.encode("utf-8", "surrogatepass")} | hexes


def check_writable(body: dict, tokenizer) -> None:
    """A 400 for a choice (`guided_choice`, `structured_outputs.choice`) the model cannot write."""
    pattern = unwritable(tokenizer)
    if pattern is None:
        return
    import re

    so = body.get("structured_outputs")
    for param, choices in (
        ("guided_choice", body.get("guided_choice")),
        ("structured_outputs.choice", so.get("choice") if isinstance(so, dict) else None),
    ):
        for c in choices if isinstance(choices, list) else ():
            if isinstance(c, str) and not re.search(pattern, c):
                raise bad(
                    f"'{param}' holds {c!r}, which has a character this model's vocabulary cannot write",
                    param.split(".")[0],
                )


def compile_for(tokenizer, grammar: str, what: str, param: str):
    """A Grammar for `tokenizer` (its vocabulary built on the first ask; this runs on a worker
    thread: the server parses requests off the event loop), or a 400 naming the unsupported part."""
    try:
        return book_for(tokenizer).compile(grammar, what)
    except (GrammarError, ValueError, TypeError) as e:  # llguidance's own errors are ValueErrors
        raise bad(f"'{param}': {e}", param) from None


def logit_bias(body: dict, vocab_size: int) -> tuple:
    """OpenAI's `logit_bias`: {token id as a string: bias in [-100, 100]} as ((id, bias), ...)."""
    lb = body.get("logit_bias")
    if lb is None:
        return ()
    if not isinstance(lb, dict):
        raise bad("'logit_bias' must be an object mapping token ids to biases", "logit_bias")
    if len(lb) > MAX_BIAS_ENTRIES:
        raise bad(f"'logit_bias' takes at most {MAX_BIAS_ENTRIES} entries", "logit_bias")
    out = []
    for k, v in lb.items():
        if not (k.isascii() and k.isdigit()) or int(k) >= vocab_size:
            raise bad(f"'logit_bias' key {k!r} is not a token id in 0..{vocab_size - 1}", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad(f"'logit_bias[{k}]' must be a number in [-100, 100], got {v!r}", "logit_bias")
        out.append((int(k), float(v)))
    return tuple(out)
