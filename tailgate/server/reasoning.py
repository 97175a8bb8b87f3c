"""A thinking model's reasoning, split from its answer (vLLM's `qwen3` reasoning parser): for the
Qwen3 family when its chat template writes `<think>`, the text between `<think>` and `</think>` is
the choice's `reasoning_content` and only the rest its `content`, whole or streamed."""

from __future__ import annotations

THINK, END = "<think>", "</think>"
FAMILIES = ("qwen3",)  # families whose templates think in <think> ... </think>


def thinks(arch: str, template: str | None) -> bool:
    """Whether a served model's answers are split: a thinking family whose template writes both tags."""
    return arch in FAMILIES and template is not None and THINK in template and END in template


def opened(prompt_text: str) -> bool:
    """Whether the prompt already opened the thinking (a template whose generation prompt ends in
    `<think>`, as Qwen3's thinking-only models' do): the answer then starts inside it."""
    return prompt_text.rstrip().endswith(THINK)


class ReasoningSplit:
    """Incremental: `push(text)` -> (reasoning, content) that can be sent now; `finish()` -> what
    was held back. An answer that opens with `<think>` (after whitespace), or a prompt that opened
    it, is reasoning up to `</think>` and content after it; one that does not is all content.
    The tags themselves are dropped. Text that could still be the start of a tag is held back, so a
    stream and the whole answer split alike. A thinking cut short (no `</think>` before the answer
    ends) stays reasoning."""

    def __init__(self, inside: bool = False):
        self.state = "reasoning" if inside else "start"
        self.held = ""
        self.thought = inside  # the answer had a thinking part

    def push(self, text: str) -> tuple[str, str]:
        self.held += text
        reasoning = content = ""
        while True:
            if self.state == "start":
                s = self.held.lstrip()
                if s.startswith(THINK):
                    self.held, self.state, self.thought = s[len(THINK) :], "reasoning", True
                    continue
                if THINK.startswith(s):  # empty, or a prefix of the tag: not decided yet
                    return reasoning, content
                self.state = "content"
                continue
            if self.state == "content":
                content += self.held
                self.held = ""
                return reasoning, content
            i = self.held.find(END)
            if i >= 0:
                reasoning += self.held[:i]
                self.held, self.state = self.held[i + len(END) :], "content"
                continue
            keep = next((k for k in range(len(END) - 1, 0, -1) if self.held.endswith(END[:k])), 0)
            cut = len(self.held) - keep
            reasoning += self.held[:cut]
            self.held = self.held[cut:]
            return reasoning, content

    def finish(self) -> tuple[str, str]:
        held, self.held = self.held, ""
        return (held, "") if self.state == "reasoning" else ("", held)


def split(text: str, inside: bool = False) -> tuple[str | None, str | None]:
    """A whole answer as (reasoning_content, content); None where there is none."""
    s = ReasoningSplit(inside)
    r, c = s.push(text)
    r2, c2 = s.finish()
    if not s.thought:
        return None, c + c2
    return r + r2, (c + c2) or None
