"""How a generation looks on the wire, per endpoint: chat completions and (text) completions differ
in their object names, their choice and delta shapes, their logprobs blocks and what a stream opens
with. `Generation` (the request lifecycle) asks its shape and never branches on the kind itself,
so a new response field touches one class here."""

from __future__ import annotations

from .reasoning import ReasoningSplit, opened, split, thinks
from .token_bytes import token_bytes
from .tools import ToolStream


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

    def close(self, choice: dict, c) -> None:
        """Make `choice` (a chunk's) the choice's last: its finish reason (tools add their calls)."""
        choice["finish_reason"] = c.finish

    def opening(self, c) -> tuple[str, bool] | None:
        """What a stream sends for choice `c` before any token, as (text, first); None: nothing."""
        return None

    def prompt_logprobs(self, c) -> list | None:
        """vLLM's `prompt_logprobs`: per prompt token (the first: null) its own entry and the top k,
        keyed by token id, each with its logprob, rank and text."""
        k = self.g.prompt_logprobs
        out = [None]
        for t, (lp, rank, top) in zip(c.req.prompt[1:], c.prompt_logprobs):
            d = {str(t): {"logprob": lp, "rank": rank, "decoded_token": self.piece(t)}}
            for r, (a, b) in enumerate(top[:k], 1):
                d.setdefault(str(a), {"logprob": b, "rank": r, "decoded_token": self.piece(a)})
            out.append(d)
        return out

    def chunk_extra(self, c) -> dict:
        """Top-level fields a stream chunk of choice `c` carries beside its choices."""
        return {}

    def full_extra(self, choices) -> dict:
        """Top-level fields of a whole response beside its choices."""
        return {}


class ChatShape(Shape):
    object_full, object_chunk = "chat.completion", "chat.completion.chunk"

    def __init__(self, g, tokenizer, inside: bool | None = None):
        """`inside`: None, the answer is not split (server/reasoning.py); else it is, and True when
        the prompt opened the thinking."""
        super().__init__(g, tokenizer)
        self.inside = inside
        self.splits: dict[int, ReasoningSplit] = {}

    def think(self, c, text: str, finish: bool) -> tuple[str, str]:
        """(reasoning, content) of this piece of choice `c`'s text; `finish`: with what was held."""
        if self.inside is None:
            return "", text
        sp = self.splits.setdefault(c.index, ReasoningSplit(self.inside))
        r, t = sp.push(text) if text else ("", "")
        if finish:
            r2, t2 = sp.finish()
            r, t = r + r2, t + t2
        return r, t

    def entry(self, t: int, lp: float) -> dict:
        p = self.piece(t)
        return {"token": p, "logprob": lp, "bytes": token_bytes(self.tok, t, p)}

    def logprobs(self, c, items):
        if c.req.logprobs is None:
            return None
        return {
            "content": [
                {**self.entry(t, lp), "top_logprobs": [self.entry(a, b) for a, b in top]} for t, lp, top in items
            ]
        }

    def chunk_choice(self, c, text, items, finish, first):
        reasoning, text = self.think(c, text, finish is not None)
        return self.delta_choice(c, reasoning, text, items, finish, first)

    def delta_choice(self, c, reasoning, text, items, finish, first):
        # A token whose text is held back (a partial character, a possible stop string) still gets
        # its chunk, with empty content, as vLLM sends it: clients time every token's arrival
        # (vLLM's bench client counts each chunk), so a skipped chunk would read as a doubled gap.
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text or not finish else {})
        if reasoning:
            delta["reasoning_content"] = reasoning
            if not text and not first:
                delta.pop("content", None)
        return {"index": c.index, "delta": delta, "logprobs": self.logprobs(c, items), "finish_reason": finish}

    def close(self, choice: dict, c) -> None:
        r, t = self.think(c, "", True)
        delta = choice["delta"]
        if t:
            delta["content"] = delta.get("content", "") + t
        if r:
            delta["reasoning_content"] = delta.get("reasoning_content", "") + r
        choice["finish_reason"] = c.finish

    def full_choice(self, c):
        message = {"role": "assistant", "content": c.stream.final_text}
        if self.inside is not None:
            message["reasoning_content"], message["content"] = split(c.stream.final_text, self.inside)
        return {
            "index": c.index,
            "message": message,
            "logprobs": self.logprobs(c, c.logprobs),
            "finish_reason": c.finish,
        }

    def opening(self, c):
        return "", True  # the assistant's role, before its first token

    # vLLM's chat `prompt_logprobs` sit beside the choices (the prompt is the choices' one); a
    # stream carries them on the first chunk after they arrive, where vLLM refuses to stream them.
    def chunk_extra(self, c):
        if self.g.prompt_logprobs is None or not c.prompt_unsent:
            return {}
        c.prompt_unsent = False
        return {"prompt_logprobs": self.prompt_logprobs(c)} if c.index == 0 else {}

    def full_extra(self, choices):
        return {} if self.g.prompt_logprobs is None else {"prompt_logprobs": self.prompt_logprobs(choices[0])}


class CompletionShape(Shape):
    object_full = object_chunk = "text_completion"

    def prompt_text(self, c) -> str:
        return self.g.prompt_texts[c.index // self.g.n]

    def logprobs(self, c, items):
        """OpenAI's legacy block; with echo, the prompt's tokens lead it (the first has no logprob,
        as in OpenAI's and vLLM's echo). text_offset: each token's start in the concatenated token
        strings, running across a stream's chunks (vLLM's reading)."""
        if c.req.logprobs is None:
            return None
        toks, lps, tops = [], [], []
        if self.g.echo and c.prompt_unsent:
            k, entries = c.req.logprobs, c.prompt_logprobs
            toks = [self.piece(t) for t in c.req.prompt]
            lps = [None] + [lp for lp, _, _ in entries]
            tops = [None] + [{self.piece(a): b for a, b in top[:k]} for _, _, top in entries]
        toks += [self.piece(t) for t, _, _ in items]
        lps += [lp for _, lp, _ in items]
        tops += [{self.piece(a): b for a, b in top} for _, _, top in items]
        offsets = []
        for t in toks:
            offsets.append(c.offset)
            c.offset += len(t)
        return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def _choice(self, c, text, items, finish) -> dict:
        ch = {"index": c.index, "text": text, "logprobs": self.logprobs(c, items), "finish_reason": finish}
        if c.prompt_unsent:  # the first chunk (or the whole answer) after they arrived carries them
            if self.g.prompt_logprobs is not None:
                ch["prompt_logprobs"] = self.prompt_logprobs(c)
            c.prompt_unsent = False
        return ch

    def chunk_choice(self, c, text, items, finish, first):
        return self._choice(c, text, items, finish)

    def full_choice(self, c):
        text = c.stream.final_text
        if self.g.echo:
            text = self.prompt_text(c) + text
        return self._choice(c, text, c.logprobs, c.finish)

    def opening(self, c):
        # With prompt logprobs asked, the echo waits for them (they ride its chunk).
        return (self.prompt_text(c), False) if self.g.echo and self.g.score_prompt is None else None


class ToolChatShape(ChatShape):
    """The chat response shape of a request with tools (`shape_for` picks it): content as it
    streams, calls as `tool_calls` (whole, or OpenAI's deltas) and their finish reason. Here, not in
    tools.py, so shapes imports tools and not the other way round (issue 36's cycle)."""

    def __init__(self, g, tokenizer, inside: bool | None = None):
        super().__init__(g, tokenizer, inside)
        self.streams: dict[int, ToolStream] = {}

    def _stream(self, c) -> ToolStream:
        return self.streams.setdefault(c.index, ToolStream(self.g.tools))

    def chunk_choice(self, c, text, items, finish, first):
        ts = self._stream(c)
        reasoning, text = self.think(c, text, False)  # calls are read from the content only
        out = self.delta_choice(c, reasoning, ts.push(text) if text else "", items, None, first)
        calls = ts.take()
        if calls:
            out["delta"]["tool_calls"] = calls
        if finish is not None:
            self.close(out, c)
        elif not first and not out["delta"].get("content"):
            out["delta"].pop("content", None)
        return out

    def close(self, choice: dict, c) -> None:
        """The choice's last chunk: held text that was no call, the calls, the finish reason."""
        ts = self._stream(c)
        r, t = self.think(c, "", True)
        if r:
            choice["delta"]["reasoning_content"] = choice["delta"].get("reasoning_content", "") + r
        rest = (ts.push(t) if t else "") + ts.finish()
        if rest:
            choice["delta"]["content"] = choice["delta"].get("content", "") + rest
        calls = ts.take()
        if calls:
            choice["delta"]["tool_calls"] = choice["delta"].get("tool_calls", []) + calls
        choice["finish_reason"] = self.g.tools.finish if ts.called and c.finish == "stop" else c.finish

    def full_choice(self, c):
        out = super().full_choice(c)
        ts = ToolStream(self.g.tools, live=False)
        text = c.stream.final_text if self.inside is None else out["message"]["content"] or ""
        content = ts.push(text) + ts.finish()
        out["message"]["content"] = content or (None if ts.calls else "")
        if ts.calls:
            out["message"]["tool_calls"] = ts.calls
            if c.finish == "stop":
                out["finish_reason"] = self.g.tools.finish
        return out


def shape_for(g, tokenizer, arch: str | None = None) -> Shape:
    """`arch`: the served family's name; a thinking family's chat answers are split (reasoning.py)."""
    if g.kind != "chat":
        return CompletionShape(g, tokenizer)
    inside = opened(g.prompt_texts[0]) if thinks(arch, getattr(tokenizer, "chat_template", None)) else None
    if getattr(g, "tools", None) is not None:  # chat with tools: server/tools.py's ToolStream reads the calls
        return ToolChatShape(g, tokenizer, inside)
    return ChatShape(g, tokenizer, inside)
