"""A token's own bytes, for logprobs' `bytes` field: a byte-fallback token (SentencePiece's
`<0xE2>`, or a byte-level BPE token holding part of a UTF-8 character) decodes alone to U+FFFD,
whose bytes are not the token's; its raw byte(s) are read from its vocabulary entry instead."""

from __future__ import annotations

import functools
import re

_HEX = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def _byte_level_inverse() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted (the one every byte-level BPE uses)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def token_bytes(tokenizer, token_id: int, text: str) -> list[int]:
    """The bytes of `token_id`, whose text alone is `text` (its decode)."""
    if "\ufffd" not in text:
        return list(text.encode())
    raw = tokenizer.id_to_token(token_id) or ""
    if m := _HEX.fullmatch(raw):
        return [int(m.group(1), 16)]
    inverse = _byte_level_inverse()
    if raw and all(ch in inverse for ch in raw):
        return [inverse[ch] for ch in raw]
    return list(text.encode())  # a token that really is U+FFFD
