"""How each chat-template family writes a tool call, one class per family, chosen from the
template: the text a call is (for the parser, for a forced call's grammar, and for an assistant
turn in the history when the template cannot render `tool_calls` itself), and the system prompt
that teaches the format when the template ignores `tools` (SmolLM2-135M's and our Gemma 3 turn
format). No universal regex: each family parses its own shape with a JSON decoder.

- Hermes / Qwen 2.5-3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block a call.
- Llama 3.1+: `{"name": ..., "parameters": {...}}` (after `<|python_tag|>` or alone), `; ` between calls.
- Gemma 3: a ```tool_code fence holding `{"name": ..., "parameters": {...}}` per line (Google's
  prompt-based function-calling format for Gemma 3, which has no tool tokens).
- SmolLM2: `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>` (its function-calling
  training format: one JSON list of calls).
- Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (v0.3 tokenizers), or
  `[TOOL_CALLS]name[ARGS]{...}` per call (v11+ tokenizers); `[TOOL_CALLS]` is a control token, so
  the text is decoded with special tokens kept (`keeps_special`), as vLLM's Mistral parser does.
"""

from __future__ import annotations

import json
import re

from .structured import JSON_OPTIONS

_decoder = json.JSONDecoder()


def _objects(text: str, sep: str = "") -> list | None:
    """Consecutive JSON values in `text` (whitespace and `sep` between them); None unless the
    whole text is made of them."""
    out, i, n = [], 0, len(text)
    while True:
        while i < n and (text[i].isspace() or (sep and text.startswith(sep, i))):
            i += len(sep) if sep and text.startswith(sep, i) else 1
        if i >= n:
            return out
        try:
            v, i = _decoder.raw_decode(text, i)
        except ValueError:
            return None
        out.append(v)


def call_schema(tools: list[dict], key: str, only: str | None) -> dict:
    """JSON schema of one call object: the function's name, then its arguments under `key`,
    validated against that function's `parameters`."""
    alts = []
    for t in tools:
        f = t["function"]
        if only is not None and f["name"] != only:
            continue
        alts.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", key],
                "properties": {
                    "name": {"const": f["name"]},
                    key: f.get("parameters") or {"type": "object", "properties": {}},
                },
            }
        )
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


class ToolFormat:
    name = ""
    key = "arguments"  # the call object's arguments field
    opener = ""  # text that starts a call where the output may also be plain content
    keeps_special = False  # its opener is a special token: decode calls with special tokens kept

    @staticmethod
    def matches(template: str, family: str | None) -> bool:
        return False

    def system_prompt(self, tools: list[dict]) -> str:
        listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
        return (
            "You can call these functions; each is described as JSON:\n" + listing + "\n\n"
            "To call one, answer with nothing but " + self.example() + ". Otherwise answer in plain text."
        )

    def example(self) -> str:
        raise NotImplementedError

    def lark(self, call: str, parallel: bool) -> str:
        """A Lark grammar (llguidance) for a whole answer that is only calls; `call` is the rule
        of one call object."""
        raise NotImplementedError

    def grammar(self, tools: list[dict], only: str | None, parallel: bool) -> str:
        # Compact JSON, as structured outputs write it (structured.JSON_OPTIONS): free whitespace
        # let a weak model loop on blanks inside a forced call until max_tokens (a tiny Mistral did).
        return self.lark("call", parallel) + self._call_rule(tools, only)

    def auto_grammar(self, tools: list[dict], parallel: bool) -> str:
        """`tool_choice: "auto"`: plain text that never writes this family's call opener, or text
        up to the opener (a lazy lexeme: it ends at the opener's first appearance) and then calls
        the schema allows: the moment the model writes the opener it is held to well-formed calls,
        so a half-formed call never comes back as content. A family whose calls are the whole
        answer (Llama 3's bare JSON) takes text that does not start with `{`, or calls alone."""
        rule = self._call_rule(tools, None)
        calls = self.lark("call", parallel)
        if not self.opener:
            plain = "PLAIN: /(?s:.*)/ & ~/\\s*\\{(?s:.*)/"
            return f"start: PLAIN | calls\n{plain}\n{calls.replace('start:', 'calls:', 1)}{rule}"
        first = f'start: "{self.opener}'
        if not calls.startswith(first):
            raise ValueError(f"{self.name}'s call grammar does not open with {self.opener!r}")
        after = 'after: "' + calls[len(first) :]  # the call grammar past its opener
        opener = re.escape(self.opener)
        return (
            f"start: PLAIN | head after\nPLAIN: /(?s:.*)/ & ~/(?s:.*){opener}(?s:.*)/\n"
            f"head[lazy]: /(?s:.*){opener}/\n{after}{rule}"
        )

    def _call_rule(self, tools: list[dict], only: str | None) -> str:
        """The grammar's `call` rule: one call object held to its function's schema."""
        return f"\ncall: %json {json.dumps({**call_schema(tools, self.key, only), 'x-guidance': JSON_OPTIONS})}\n"

    def render(self, calls: list[dict]) -> str:
        """An assistant turn's calls (name, arguments as an object) as this family writes them."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[dict]] | None:
        """(content before the calls, [{name, arguments}]) when `text` holds calls; else None."""
        raise NotImplementedError

    def _calls(self, objs) -> list[dict] | None:
        if not objs or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in objs):
            return None
        out = []
        for o in objs:
            args = o.get(self.key, o.get("arguments", o.get("parameters", {})))
            if isinstance(args, str):  # some models write the arguments as a JSON string
                try:
                    args = json.loads(args)
                except ValueError:
                    return None
            if not isinstance(args, dict):
                return None
            out.append({"name": o["name"], "arguments": args})
        return out

    def _obj(self, c: dict) -> str:
        return json.dumps({"name": c["name"], self.key: c["arguments"]}, ensure_ascii=False)


class Hermes(ToolFormat):
    name, opener = "hermes", "<tool_call>"

    @staticmethod
    def matches(template, family):
        return "<tool_call>" in template and "tools" in template

    def example(self):
        return '<tool_call>\n{"name": <function name>, "arguments": <its arguments as a JSON object>}\n</tool_call>'

    def lark(self, call, parallel):
        one = f'"<tool_call>\\n" {call} "\\n</tool_call>"'
        return f"start: {one}" + (f' ("\\n" {one})*' if parallel else "")

    def render(self, calls):
        return "\n".join(f"<tool_call>\n{self._obj(c)}\n</tool_call>" for c in calls)

    def parse(self, text):
        head, sep, rest = text.partition("<tool_call>")
        if not sep:
            return None
        objs = []
        for block in ("<tool_call>" + rest).split("<tool_call>")[1:]:
            body, closed, tail = block.partition("</tool_call>")
            got = _objects(body)
            if got is None or len(got) != 1 or (tail.strip() and not closed):
                return None
            objs += got
        calls = self._calls(objs)
        return (head.strip(), calls) if calls else None


class JsonList(ToolFormat):
    """A family that writes its calls as one JSON list after its opener: `{opener}[{call}, ...]{closer}`."""

    closer = ""

    def example(self):
        return (
            f'{self.opener}[{{"name": <function name>, "arguments": <its arguments as a JSON object>}}]{self.closer} '
            "(several calls: several objects in the list)"
        )

    def lark(self, call, parallel):
        return f'start: "{self.opener}[" {call}' + (f' (", " {call})*' if parallel else "") + f' "]{self.closer}"'

    def render(self, calls):
        return f"{self.opener}[" + ", ".join(self._obj(c) for c in calls) + f"]{self.closer}"

    def _list(self, body: str) -> list | None:
        """The call objects of one JSON list (or a lone object) in `body`."""
        got = _objects(body)
        if got is None or len(got) != 1:
            return None
        return got[0] if isinstance(got[0], list) else [got[0]]


class SmolLM2(JsonList):
    name, opener, closer = "smollm2", "<tool_call>", "</tool_call>"

    @staticmethod
    def matches(template, family):
        return "<|im_start|>" in template

    def parse(self, text):
        head, sep, rest = text.partition("<tool_call>")
        if not sep:
            return None
        calls = self._calls(self._list(rest.split("</tool_call>")[0]))
        return (head.strip(), calls) if calls else None


class Llama3(ToolFormat):
    name, key = "llama3", "parameters"

    @staticmethod
    def matches(template, family):
        return "<|python_tag|>" in template or "<|eom_id|>" in template

    def example(self):
        return '{"name": <function name>, "parameters": <its arguments as a JSON object>}'

    def lark(self, call, parallel):
        return f"start: {call}" + (f' ("; " {call})*' if parallel else "")

    def render(self, calls):
        return "; ".join(self._obj(c) for c in calls)

    def parse(self, text):
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):  # Llama 3 calls are the whole answer, never mid-text
            return None
        calls = self._calls(_objects(body, ";"))
        return ("", calls) if calls else None


class Gemma(ToolFormat):
    name, key, opener = "gemma", "parameters", "```tool_code"

    @staticmethod
    def matches(template, family):
        return family == "gemma3" or "<start_of_turn>" in template

    def example(self):
        return (
            '```tool_code\n{"name": <function name>, "parameters": <its arguments as a JSON object>}\n``` '
            "(several calls: one object per line)"
        )

    def lark(self, call, parallel):
        return f'start: "```tool_code\\n" {call}' + (f' ("\\n" {call})*' if parallel else "") + ' "\\n```"'

    def render(self, calls):
        return "```tool_code\n" + "\n".join(self._obj(c) for c in calls) + "\n```"

    def parse(self, text):
        head, sep, rest = text.partition("```tool_code")
        if not sep:
            return None
        calls = self._calls(_objects(rest.split("```")[0]))
        return (head.strip(), calls) if calls else None


class Mistral(JsonList):
    name, opener, keeps_special = "mistral", "[TOOL_CALLS]", True

    @staticmethod
    def matches(template, family):
        return "[TOOL_CALLS]" in template

    def parse(self, text):
        head, sep, rest = text.partition("[TOOL_CALLS]")
        if not sep:
            return None
        body = rest.strip()
        if body.startswith(("[", "{")):  # v0.3: one JSON list of calls (or a lone object)
            objs = self._list(body.removesuffix("</s>"))
        else:  # v11+: name[ARGS]{...}, each call after its own [TOOL_CALLS]
            objs = []
            for part in body.split("[TOOL_CALLS]"):
                name, has_args, args = part.partition("[ARGS]")
                got = _objects(args) if has_args else None
                if not name.strip() or got is None or len(got) != 1:
                    return None
                objs.append({"name": name.strip(), "arguments": got[0]})
        calls = self._calls(objs)
        return (head.strip(), calls) if calls else None


# Most specific first: a template that writes <tool_call> is Hermes even when it is ChatML.
FORMATS = (Hermes(), Mistral(), Llama3(), Gemma(), SmolLM2())


def format_for(template: str | None, family: str | None) -> ToolFormat:
    t = template or ""
    return next((f for f in FORMATS if f.matches(t, family)), FORMATS[0])


def format_known(template: str | None, family: str | None) -> bool:
    """Whether the template names its family's call format (else format_for's Hermes is a guess)."""
    return any(f.matches(template or "", family) for f in FORMATS)
