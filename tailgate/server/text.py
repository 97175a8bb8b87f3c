"""Turning a growing list of token ids into text deltas, with stop strings applied."""

from __future__ import annotations


class TextStream:
    """Decodes incrementally and releases only text that is final: not ending in a partial UTF-8
    character, and not a possible beginning of a stop string.

    Incremental as vLLM does it: each token decodes only a short window of ids (from `prefix`,
    the start of the last emitted piece) twice, with and without the unread tail, and appends the
    difference; decoding the window both ways keeps tokenizer context (a SentencePiece leading
    space, a multi-byte character split across tokens) the same as a full decode. A full decode
    per token made a long answer quadratic on the event loop."""

    def __init__(self, tokenizer, stop: list[str], skip_special: bool = True, keep_stop: bool = False):
        self.tok = tokenizer
        self.stop = stop
        self.skip_special = skip_special
        self.keep_stop = keep_stop
        self.ids: list[int] = []
        self.prefix = self.read = 0  # token offsets: window start, first id not yet in `text`
        self.sent = 0  # characters already released
        self.text = ""
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one token; return the newly final text (may be empty)."""
        self.ids.append(token)
        if self.stopped or not self._advance(final=False):
            return ""
        text = self.text
        for s in self.stop:
            i = text.find(s, max(0, self.sent - len(s) + 1))
            if i != -1:
                self.stopped = True
                end = i + len(s) if self.keep_stop else i
                return self._release(end)
        hold = max((len(s) - 1 for s in self.stop), default=0)
        # Hold back a tail that could still grow into a stop string.
        safe = len(text)
        for k in range(min(hold, len(text)), 0, -1):
            if any(s.startswith(text[-k:]) for s in self.stop):
                safe = len(text) - k
                break
        return self._release(safe)

    def flush(self) -> str:
        """At the end of the stream: whatever is left (no stop string matched)."""
        if self.stopped:
            return ""
        self._advance(final=True)
        return self._release(len(self.text))

    def _advance(self, final: bool) -> bool:
        """Append the text of ids[read:] to `text`; False while it ends in a partial character."""
        if self.read == len(self.ids):
            return False
        before = self.tok.decode(self.ids[self.prefix : self.read], skip_special=self.skip_special)
        after = self.tok.decode(self.ids[self.prefix :], skip_special=self.skip_special)
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return False
        self.text += after[len(before) :]
        self.prefix, self.read = self.read, len(self.ids)
        return True

    def _release(self, end: int) -> str:
        out = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        if self.stopped:
            self.text = self.text[:end]
        return out

    @property
    def final_text(self) -> str:
        return self.text[: self.sent] if self.stopped else self.text
