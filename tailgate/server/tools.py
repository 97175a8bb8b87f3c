"""Tool calling on chat: `tools` / `tool_choice` (and the legacy `functions` / `function_call`)
read into a `ToolPlan`; the conversation's tool turns prepared for the chat template; the answer
parsed back into OpenAI's `tool_calls`, whole or as streamed deltas. The text of a call is the
template family's (`tool_formats.py`); `required` and a named function are forced by a grammar
(model/constraint.py), so their arguments always validate against the function's schema.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from .errors import bad
from .tool_formats import ToolFormat, format_for, format_known
from .tool_scan import scan


@dataclass
class ToolPlan:
    tools: list[dict]  # [{"type": "function", "function": {name, description?, parameters?}}]
    choice: str  # auto | required | named
    fmt: ToolFormat
    named: str | None = None
    parallel: bool = True
    grammar: str | None = None  # llguidance grammar when the choice forces a call
    template_tools: bool = True  # the template renders `tools` itself (else we write the system prompt)

    @property
    def names(self) -> frozenset:
        """The functions the request offers (a call to any other stays text)."""
        return frozenset(t["function"]["name"] for t in self.tools)

    @property
    def finish(self) -> str:
        """OpenAI's finish_reason for an answer that called: a forced named function ends "stop"."""
        return "stop" if self.choice == "named" else "tool_calls"


def _function(t, param: str) -> dict:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
        raise bad(f"'{param}' must be a function with a non-empty 'name'", param.split("[")[0])
    params = t.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise bad(f"'{param}.parameters' must be a JSON schema object", param.split("[")[0])
    out = {"name": t["name"]}
    if t.get("description") is not None:
        if not isinstance(t["description"], str):
            raise bad(f"'{param}.description' must be a string", param.split("[")[0])
        out["description"] = t["description"]
    out["parameters"] = params if params is not None else {"type": "object", "properties": {}}
    return out


def plan(body: dict, tokenizer) -> ToolPlan | None:
    """The request's tools, or None when it has none (or tool_choice "none": the model answers
    in text and is not shown the tools, as vLLM does unless asked otherwise)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):  # checked with or without tools
        raise bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if body.get("functions") is not None:  # legacy: functions + function_call
        if tools is not None:
            raise bad("'functions' and 'tools' cannot both be given", "functions")
        fs = body["functions"]
        if not isinstance(fs, list):
            raise bad("'functions' must be a list", "functions")
        tools = [{"type": "function", "function": f} for f in fs]
        fc = body.get("function_call")
        choice = {"type": "function", "function": fc} if isinstance(fc, dict) else fc
    elif body.get("function_call") is not None:
        raise bad("'function_call' needs 'functions'", "function_call")
    if tools is None:
        if choice not in (None, "none"):
            raise bad("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise bad("'tools' must be a non-empty list", "tools")
    fns = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise bad(f"'tools[{i}].type' must be \"function\"", "tools")
        fns.append({"type": "function", "function": _function(t.get("function"), f"tools[{i}].function")})
    # Names need not be unique (vLLM does not ask it, and no JSON schema can say it of a list's
    # items): a forced call to a repeated name takes either definition's arguments.
    names = [f["function"]["name"] for f in fns]
    named = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type", "function") != "function" or not isinstance(fn, dict) or fn.get("name") not in names:
            raise bad(
                "'tool_choice' must name one of the request's tools: "
                '{"type": "function", "function": {"name": ...}}',
                "tool_choice",
            )
        choice, named = "named", fn["name"]
    elif choice not in ("none", "auto", "required"):
        raise bad(f"'tool_choice' must be none, auto, required or a named function; got {choice!r}", "tool_choice")
    if choice == "none":
        return None
    template = tokenizer.chat_template or ""
    p = ToolPlan(
        fns,
        choice,
        format_for(template, None),
        named,
        parallel is not False and named is None,
        template_tools="tools" in template,
    )
    if choice in ("required", "named"):
        p.grammar = p.fmt.grammar(fns, named, p.parallel)
    elif format_known(template, None):  # auto, in a format we know: text, or a call the schema allows
        p.grammar = p.fmt.auto_grammar(fns, p.parallel)
    return p


def template_messages(messages: list[dict], p: ToolPlan | None, fmt: ToolFormat) -> list[dict]:
    """The conversation as the template receives it. A template that renders tools gets OpenAI's
    turns in HF's shape (arguments as objects); one that does not gets each assistant call as the
    family's text, and the tool prompt folded into the system turn when the request has tools."""
    native = p.template_tools if p is not None else False
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if calls:
            parsed = [{"name": c["function"]["name"], "arguments": _args(c["function"]["arguments"])} for c in calls]
            if native:
                m["tool_calls"] = [
                    {
                        "id": c.get("id"),
                        "type": "function",
                        "function": {"name": x["name"], "arguments": x["arguments"]},
                    }
                    for c, x in zip(calls, parsed)
                ]
            else:
                m["content"] = ((m.get("content") or "") + "\n" + fmt.render(parsed)).strip()
        out.append(m)
    if p is not None and not native:
        prompt = p.fmt.system_prompt(p.tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": (out[0]["content"] + "\n\n" + prompt).strip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _args(a):
    """An earlier call's arguments as the template gets them: a JSON object string parsed (HF's
    shape); "" or blank is no arguments (vLLM's rule); any other text is passed on as written.
    It is history the client replays (a model's call can carry arguments that are not JSON), and
    OpenAI's schema, like ours, takes any string: refusing it would refuse a schema-valid body."""
    if isinstance(a, dict):
        return a
    if not a.strip():
        return {}
    try:
        v = json.loads(a)
    except ValueError:
        return a
    return v if isinstance(v, dict) else a


@dataclass
class ToolStream:
    """One choice's answer read for calls: plain content passes through (held back only while it
    may be opening a call); once a call starts, its text is held for the parser at the end, while
    the calls written so far go out as OpenAI's deltas (`take`): a call opens (index, id, type,
    name, empty arguments) once its name has closed and names one of the request's functions,
    then its arguments follow as the model writes them (`tool_scan.py`). What only looked like a
    call (no offered name ever closed) is given back as text at the end."""

    plan: ToolPlan
    held: str = ""
    calling: bool = False
    calls: list = field(default_factory=list)  # whole calls, once `finish` parsed them
    opened: list = field(default_factory=list)  # ids of the calls opened as deltas
    sent: list = field(default_factory=list)  # per opened call: argument characters sent
    emitted: list = field(default_factory=list)  # every delta, in order
    live: bool = True  # a stream (deltas as the calls are written); False: a whole answer, read once at the end
    _pending: list = field(default_factory=list)

    def push(self, text: str) -> str:
        """Content to send now for `text` (the rest is held); new call deltas wait in `take`."""
        out = self._content(text)
        if self.held and self.live:
            self._advance()
        return out

    def _content(self, text: str) -> str:
        if self.plan.choice != "auto" or self.calling:
            self.held += text
            return ""
        self.held += text
        opener = self.plan.fmt.opener
        if not opener:  # the call is the whole answer (Llama 3): hold while it may be one
            lead = self.held.lstrip()
            if lead and not ("{".startswith(lead[:1]) or "<|python_tag|>".startswith(lead[:14])):
                out, self.held = self.held, ""
                return out
            self.calling = bool(lead)
            return ""
        at = self.held.find(opener)
        if at >= 0:
            self.calling = True
            out, self.held = self.held[:at], self.held[at:]
            return out
        keep = next(
            (k for k in range(min(len(opener) - 1, len(self.held)), 0, -1) if opener.startswith(self.held[-k:])), 0
        )
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return out

    def _body(self) -> str:
        opener = self.plan.fmt.opener
        if not opener:
            return self.held.lstrip()
        at = self.held.find(opener)
        return self.held[at + len(opener) :] if at >= 0 else ""

    def _emit(self, delta: dict) -> None:
        self._pending.append(delta)
        self.emitted.append(delta)

    def _advance(self) -> None:
        """Deltas for what the held text has added to its calls since the last look."""
        allowed = self.plan.names
        fmt = self.plan.fmt
        for i, pc in enumerate(scan(self._body(), (fmt.key, "arguments", "parameters"))):
            if i == len(self.opened):
                if pc.name is None or pc.name not in allowed:
                    return  # not (yet) a call of this request's: nothing goes out
                self.opened.append("call_" + uuid.uuid4().hex[:24])
                self.sent.append(0)
                self._emit(
                    {
                        "index": i,
                        "id": self.opened[i],
                        "type": "function",
                        "function": {"name": pc.name, "arguments": ""},
                    }
                )
            if pc.args_object and self.sent[i] >= 0 and len(pc.args) > self.sent[i]:
                self._emit({"index": i, "function": {"arguments": pc.args[self.sent[i] :]}})
                self.sent[i] = len(pc.args)

    def take(self) -> list[dict]:
        """The deltas not yet sent."""
        out, self._pending = self._pending, []
        return out

    @property
    def called(self) -> bool:
        return bool(self.calls or self.opened)

    def finish(self) -> str:
        """At the end: content still owed (when the held text was no call); fills `calls` and
        queues the deltas still owed (`take`)."""
        if self.held and self.live:
            self._advance()
        got = self.plan.fmt.parse(self.held) if self.held else None
        allowed = self.plan.names
        if got is None or any(c["name"] not in allowed for c in got[1]):  # a made-up function: text stays text
            if self.opened:  # calls already went out as deltas: they stand, the rest is theirs
                self.held = ""
                return ""
            out, self.held = self.held, ""
            return out
        content, calls = got
        self.calls = [
            {
                "id": self.opened[i] if i < len(self.opened) else "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for i, c in enumerate(calls)
        ]
        for i, c in enumerate(self.calls):
            if i >= len(self.opened):
                self._emit(
                    {
                        "index": i,
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["function"]["name"], "arguments": ""},
                    }
                )
            if i >= len(self.opened) or self.sent[i] == 0:  # arguments not streamed (e.g. written as a string)
                self._emit({"index": i, "function": {"arguments": c["function"]["arguments"]}})
        self.held = ""
        return content
