"""Tool calls read from an answer that is still being written: each call's name as soon as its
string closes, and its arguments' raw JSON text as far as it has arrived, so a stream can send
OpenAI's deltas (a call opened with its name, then argument fragments) while the model writes,
as OpenAI and vLLM do, instead of holding the whole call to the end.

Every family (`tool_formats.py`) writes a call as a JSON object `{"name": ..., <key>: {...}}`
after its opener, calls separated by glue (whitespace, `,`, `;`, a list's `[`, Hermes' tags).
The scan reads those objects with a string-aware bracket count; it never decides whether the
answer *is* a call (the family's parser does that on the whole text at the end), it only says
what has been written so far. A value it cannot finish yet (a string still open, a number that
may go on) ends the scan until more text comes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_GLUE = ("<tool_call>", "</tool_call>", "<|python_tag|>", ",", ";", "[")


@dataclass
class PartialCall:
    name: str | None  # None until the name's string has closed
    args: str  # the arguments' raw text so far ("" before they start)
    args_object: bool  # the arguments are a JSON object (a string form cannot stream: it is decoded at the end)
    done: bool  # the call object has closed


def _string_end(t: str, i: int) -> int | None:
    """The index after the string starting at t[i] == '"', or None while it is still open."""
    j = i + 1
    while j < len(t):
        c = t[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def _value_end(t: str, i: int) -> int | None:
    """The index after the JSON value starting at t[i], or None while it may still go on."""
    c = t[i]
    if c == '"':
        return _string_end(t, i)
    if c in "{[":
        depth, j = 0, i
        while j < len(t):
            c = t[j]
            if c == '"':
                j = _string_end(t, j)
                if j is None:
                    return None
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i  # a number or a literal: it ends where something else starts
    while j < len(t) and t[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(t) else None


def _skip_space(t: str, i: int) -> int:
    while i < len(t) and t[i].isspace():
        i += 1
    return i


def _object(t: str, i: int, keys: tuple[str, ...]) -> tuple[PartialCall, int | None]:
    """The call object starting at t[i] == '{': what of it has arrived, and the index after it
    (None while it is open)."""
    call = PartialCall(None, "", False, False)
    j = i + 1
    while True:
        j = _skip_space(t, j)
        if j >= len(t):
            return call, None
        if t[j] == "}":
            call.done = True
            return call, j + 1
        if t[j] == ",":
            j += 1
            continue
        if t[j] != '"':
            return call, None  # not JSON a call is made of: the parser at the end decides
        k_end = _string_end(t, j)
        if k_end is None:
            return call, None
        key = json.loads(t[j:k_end])
        j = _skip_space(t, k_end)
        if j >= len(t) or t[j] != ":":
            return call, None
        v = _skip_space(t, j + 1)
        if v >= len(t):
            return call, None
        end = _value_end(t, v)
        if key in keys and call.args == "":
            call.args, call.args_object = t[v:end] if end is not None else t[v:], t[v] == "{"
        elif key == "name" and end is not None and t[v] == '"':
            call.name = json.loads(t[v:end])
        if end is None:
            return call, None
        j = end


def scan(body: str, keys: tuple[str, ...]) -> list[PartialCall]:
    """The calls written so far in `body` (the answer from its opener on); `keys` name the
    arguments' field (the family's key first)."""
    out, i = [], 0
    while True:
        while True:  # glue between calls
            i = _skip_space(body, i)
            g = next((g for g in _GLUE if body.startswith(g, i)), None)
            if g is None:
                break
            i += len(g)
        if i >= len(body) or body[i] != "{":
            return out
        call, i = _object(body, i, keys)
        out.append(call)
        if i is None:
            return out
