"""OpenAI's Responses API mapped onto the chat path: a Responses request becomes a chat
completion body (`chat_body`), the chat answer becomes a Response object (`response_from`), and a
chat stream's chunks become the Responses stream's typed events (`ResponseEvents`)."""

from __future__ import annotations

import json
import time
import uuid

from .errors import bad


def _text(content, where: str) -> str:
    """A message item's content: a string, or parts of type input_text / output_text / text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{where}.content' must be a string or a list of text parts", "input")
    out = []
    for j, p in enumerate(content):
        if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text"):
            raise bad(f"'{where}.content[{j}]' must be a text part (input_text, output_text)", "input")
        if not isinstance(p.get("text"), str):
            raise bad(f"'{where}.content[{j}].text' must be a string", "input")
        out.append(p["text"])
    return "\n".join(out)


def _messages(m) -> list[dict]:
    out = []
    if m.instructions:
        out.append({"role": "system", "content": m.instructions})
    if isinstance(m.input, str):
        return out + [{"role": "user", "content": m.input}]
    for i, item in enumerate(m.input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"'{where}' must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad(f"'{where}.role' must be user, assistant, system or developer", "input")
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise bad(f"'{where}': a function_call needs string call_id, name and arguments", "input")
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
                raise bad(f"'{where}': a function_call_output needs string call_id and output", "input")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif kind == "reasoning":
            continue  # an earlier answer's thinking: the chat templates drop it from the history
        else:
            raise bad(f"'{where}.type' {kind!r} is not served (message, function_call, function_call_output)", "input")
    if not out:
        raise bad("'input' holds no message", "input")
    return out


def chat_body(m) -> dict:
    """The chat completion body that asks what the validated Responses request `m` asks."""
    if m.previous_response_id is not None:
        raise bad("'previous_response_id': responses are not stored here; send the whole input", "previous_response_id")
    body: dict = {"model": m.model, "messages": _messages(m), "stream": bool(m.stream)}
    if m.stream:
        body["stream_options"] = {"include_usage": True}
    for ours, theirs in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if getattr(m, ours) is not None:
            body[theirs] = getattr(m, ours)
    if m.tools:
        fns = []
        for i, t in enumerate(m.tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                raise bad(f"'tools[{i}].type' must be \"function\" (the only tools served)", "tools")
            fns.append(
                {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
            )
        body["tools"] = fns
    tc = m.tool_choice
    if isinstance(tc, dict):
        if tc.get("type") != "function" or not isinstance(tc.get("name"), str):
            raise bad("'tool_choice' must be auto, none, required or {type: function, name}", "tool_choice")
        body["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    elif tc is not None:
        body["tool_choice"] = tc
    if m.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = m.parallel_tool_calls
    if m.reasoning and m.reasoning.get("effort") is not None:
        body["reasoning_effort"] = m.reasoning["effort"]
    fmt = (m.text or {}).get("format") if isinstance(m.text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        js = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        body["response_format"] = {"type": "json_schema", "json_schema": js}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    return body


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _usage(u: dict | None) -> dict | None:
    if u is None:
        return None
    return {
        "input_tokens": u["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)},
        "output_tokens": u["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u["total_tokens"],
    }


def shell(rid: str, created: int, model: str, m, status: str, output: list, usage=None, finish=None) -> dict:
    """A Response object (OpenAI's fields, echoing the request's settings)."""
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        "instructions": m.instructions,
        "max_output_tokens": m.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": m.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": (m.reasoning or {}).get("effort"), "summary": None},
        "store": False,
        "temperature": m.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": m.tool_choice if m.tool_choice is not None else "auto",
        "tools": m.tools or [],
        "top_p": m.top_p,
        "truncation": "disabled",
        "usage": _usage(usage),
        "metadata": m.metadata or {},
    }


def _reasoning_item(text: str, iid: str | None = None) -> dict:
    return {
        "type": "reasoning",
        "id": iid or _id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def _message_item(text: str, iid: str | None = None, status: str = "completed") -> dict:
    return {
        "type": "message",
        "id": iid or _id("msg"),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(call: dict, iid: str | None = None, status: str = "completed") -> dict:
    return {
        "type": "function_call",
        "id": iid or _id("fc"),
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": status,
    }


def response_from(full: dict, m) -> dict:
    """A whole chat completion as a Response."""
    choice = full["choices"][0]
    msg = choice["message"]
    output = []
    if msg.get("reasoning_content"):
        output.append(_reasoning_item(msg["reasoning_content"]))
    if msg.get("content"):
        output.append(_message_item(msg["content"]))
    output += [_call_item(c) for c in msg.get("tool_calls") or []]
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    return shell(_id("resp"), full["created"], full["model"], m, status, output, full["usage"], choice["finish_reason"])


class ResponseEvents:
    """A chat stream's chunks (parsed `data:` objects) as the Responses stream's events: the
    response created, then per output item (reasoning, the message, each function call) its
    added / delta / done events, then `response.completed` (`response.incomplete` when cut at
    max_output_tokens) with the whole Response."""

    def __init__(self, m, model: str):
        self.m, self.model = m, model
        self.rid, self.created, self.seq = _id("resp"), int(time.time()), 0
        self.output: list[dict] = []  # finished items
        self.open: dict | None = None  # the item being streamed: {"kind", "id", "text"/"call", "index"}
        self.finish, self.usage = None, None

    def _ev(self, kind: str, **fields) -> str:
        d = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(d)}\n\n"

    def start(self) -> str:
        r = shell(self.rid, self.created, self.model, self.m, "in_progress", [])
        return self._ev("response.created", response=r) + self._ev("response.in_progress", response=r)

    def _close(self) -> str:
        o, self.open = self.open, None
        if o is None:
            return ""
        i, iid = o["index"], o["id"]
        if o["kind"] == "reasoning":
            item = _reasoning_item(o["text"], iid)
            out = self._ev("response.reasoning_text.done", item_id=iid, output_index=i, content_index=0, text=o["text"])
        elif o["kind"] == "message":
            item = _message_item(o["text"], iid)
            part = item["content"][0]
            out = self._ev(
                "response.output_text.done", item_id=iid, output_index=i, content_index=0, text=o["text"], logprobs=[]
            )
            out += self._ev("response.content_part.done", item_id=iid, output_index=i, content_index=0, part=part)
        else:
            item = _call_item(o["call"], iid)
            out = self._ev(
                "response.function_call_arguments.done",
                item_id=iid,
                output_index=i,
                arguments=item["arguments"],
                name=item["name"],
            )
        self.output.append(item)
        return out + self._ev("response.output_item.done", output_index=i, item=item)

    def _open(self, kind: str, call: dict | None = None) -> str:
        out = self._close()
        i = len(self.output)
        if kind == "reasoning":
            self.open = {"kind": kind, "id": _id("rs"), "text": "", "index": i}
            item = {"type": "reasoning", "id": self.open["id"], "summary": [], "content": []}
        elif kind == "message":
            self.open = {"kind": kind, "id": _id("msg"), "text": "", "index": i}
            item = {
                "type": "message",
                "id": self.open["id"],
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        else:
            self.open = {"kind": kind, "id": _id("fc"), "call": call, "index": i, "tc": call.get("tc_index")}
            item = _call_item(call, self.open["id"], "in_progress")
        out += self._ev("response.output_item.added", output_index=i, item=item)
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._ev(
                "response.content_part.added", item_id=self.open["id"], output_index=i, content_index=0, part=part
            )
        return out

    def _text(self, kind: str, event: str, text: str, **extra) -> str:
        """A text delta of a `kind` item (reasoning or message): the item opened first unless it
        is the open one, then its delta event."""
        out = "" if self.open is not None and self.open["kind"] == kind else self._open(kind)
        o = self.open
        o["text"] += text
        return out + self._ev(event, item_id=o["id"], output_index=o["index"], content_index=0, delta=text, **extra)

    def chunk(self, c: dict) -> str:
        """One chat chunk's events."""
        if c.get("usage"):
            self.usage = c["usage"]
        out = ""
        for ch in c.get("choices") or []:
            d = ch.get("delta") or {}
            if d.get("reasoning_content"):
                out += self._text("reasoning", "response.reasoning_text.delta", d["reasoning_content"])
            if d.get("content"):
                out += self._text("message", "response.output_text.delta", d["content"], logprobs=[])
            for tc in d.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if self.open is None or self.open["kind"] != "call" or self.open["tc"] != tc.get("index"):
                    call = {
                        "id": tc.get("id") or _id("call"),
                        "function": {"name": fn.get("name", ""), "arguments": ""},
                        "tc_index": tc.get("index"),
                    }
                    out += self._open("call", call)
                o = self.open
                if fn.get("arguments"):
                    o["call"]["function"]["arguments"] += fn["arguments"]
                    out += self._ev(
                        "response.function_call_arguments.delta",
                        item_id=o["id"],
                        output_index=o["index"],
                        delta=fn["arguments"],
                    )
            if ch.get("finish_reason"):
                self.finish = ch["finish_reason"]
        return out

    def error(self, body: dict) -> str:
        e = body.get("error") or {}
        return self._ev("error", code=str(e.get("code")), message=e.get("message", ""), param=e.get("param"))

    def end(self) -> str:
        out = self._close()
        status = "incomplete" if self.finish == "length" else "completed"
        r = shell(self.rid, self.created, self.model, self.m, status, self.output, self.usage, self.finish)
        return out + self._ev("response.incomplete" if status == "incomplete" else "response.completed", response=r)
