"""From a request body to a `GenRequest`: the pydantic shapes (`schema.py`) check types and
ranges; this adds what depends on the model (vocabulary, chat template) and on what we implement.

Fail closed: a field we would silently drop is refused with a 400; harmless extras that common
clients send are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pydantic import BaseModel, ValidationError

from ..engine.request import SamplingParams
from .errors import ApiError, bad  # noqa: F401  (the request parsers' errors; named here for their callers)
from .schema import MAX_STOP, MAX_STOP_CHARS, ChatCompletionRequest, ChatMessage, CompletionRequest


# Fields whose meaning we do not implement (OpenAI's and vLLM's extra parameters): refusing beats
# silently ignoring them. Set means anything but null / an empty string, list or object: 0 and
# false are values (`prompt_logprobs: 0` asks for something).
# (response_format, structured_outputs, guided_*, logit_bias: server/structured.py; tools: server/tools.py.)
_REFUSED_IF_SET = (
    "suffix",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "prompt_logprobs",
    "audio",
    "prediction",
    "lora_request",
    "bad_words",
    "allowed_token_ids",
    "truncate_prompt_tokens",
    "chat_template",
    "documents",
    "mm_processor_kwargs",
    "logits_processors",
    "priority",
    "kv_transfer_params",
    "vllm_xargs",
    "cache_salt",
    "modalities",
    "web_search_options",
)
# Chat's template and tool fields mean nothing to a completion: refused there like the above.
_CHAT_ONLY = (
    "chat_template_kwargs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "reasoning_effort",
)
# Fields we accept only at the value that means what we do.
_REFUSED_UNLESS = {
    "use_beam_search": False,
    "length_penalty": 1,
    "spaces_between_special_tokens": True,
    "return_tokens_as_token_ids": False,
}
_COMPLETION_UNLESS = {"continue_final_message": False}
# add_special_tokens: completions add the model's BOS, chat relies on the template (vLLM's defaults).
_SPECIAL_TOKENS = {"completion": True, "chat": False}


def _is_set(v) -> bool:
    return v is not None and not (isinstance(v, (str, list, dict)) and not v)


@dataclass
class GenRequest:
    kind: str  # "completion" | "chat"
    model: str
    prompts: list[list[int]]
    prompt_texts: list[str]
    max_tokens: int | None
    max_tokens_asked: dict = field(default_factory=dict)  # each of max_tokens / max_completion_tokens given
    n: int = 1
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    echo: bool = False
    prompt_logprobs: int | None = None  # vLLM's field: the choice's `prompt_logprobs` list, top k
    score_prompt: int | None = None  # the engine's ask: top k over echo's and vLLM's (None: not scored)
    stream: bool = False
    include_usage: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    tools: object = None  # server/tools.py ToolPlan: the answer is read for tool calls


def validate(model: type[BaseModel], body: dict) -> BaseModel:
    """The body as `model`, or a 400 naming the first field that is wrong (its top-level name is
    the OpenAI error's `param`)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = [str(x) for x in err["loc"]]
        param = loc[0] if loc else None
        # Union branches show up in the location as type tags ("constrained-str", "list[...]").
        where = ".".join(x for x in loc if x not in ("str", "int", "float", "bool") and not any(c in x for c in "-[]"))
        raise bad(f"'{where or param}': {err['msg']}", param) from None


def _pick(*values, default=None):
    return next((v for v in values if v is not None), default)


def parse_common(body: dict, kind: str, vocab_size: int, defaults: dict | None = None) -> tuple[GenRequest, BaseModel]:
    """`defaults`: the model's recommended sampling (hf_loader.sampling_defaults), for what the
    request leaves unset."""
    d = defaults or {}
    for k in _REFUSED_IF_SET + (_CHAT_ONLY if kind == "completion" else ()):
        if k == "prompt_logprobs":  # served (engine/prompt_logprobs.py); the schema bounds it
            continue
        if _is_set(body.get(k)):
            raise bad(f"'{k}' is not supported by this server", k)
    unless = {
        **_REFUSED_UNLESS,
        **(_COMPLETION_UNLESS if kind == "completion" else {}),
        "add_special_tokens": _SPECIAL_TOKENS[kind],
    }
    for k, ok in unless.items():
        v = body.get(k)
        if v is not None and (isinstance(v, bool) != isinstance(ok, bool) or v != ok):
            raise bad(f"'{k}': only {str(ok).lower()} is supported by this server, got {v!r}", k)
    if body.get("best_of") not in (None, 1) and body.get("best_of") != body.get("n", 1):
        raise bad("'best_of' other than n is not supported", "best_of")
    m = validate(CompletionRequest if kind == "completion" else ChatCompletionRequest, body)
    params = SamplingParams(
        temperature=float(_pick(m.temperature, d.get("temperature"), default=1.0)),
        top_k=max(0, int(_pick(m.top_k, d.get("top_k"), default=0))),
        top_p=float(_pick(m.top_p, d.get("top_p"), default=1.0)),
        min_p=float(_pick(m.min_p, d.get("min_p"), default=0.0)),
        seed=m.seed,
        presence_penalty=float(_pick(m.presence_penalty, default=0.0)),
        frequency_penalty=float(_pick(m.frequency_penalty, default=0.0)),
        repetition_penalty=float(_pick(m.repetition_penalty, d.get("repetition_penalty"), default=1.0)),
    )
    from .structured import logit_bias

    params.logit_bias = logit_bias(body, vocab_size)
    stop = [m.stop] if isinstance(m.stop, str) else (m.stop or [])
    # schema.py declares (and pydantic already holds) these bounds: an empty string counts toward
    # the 16 as /openapi.json says, though it stops nothing
    if len(stop) > MAX_STOP:
        raise bad(f"'stop' takes at most {MAX_STOP} strings", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):  # each token re-scans a hold-back of this length
        raise bad(f"each 'stop' string takes at most {MAX_STOP_CHARS} characters", "stop")
    stop = [s for s in stop if s]
    stop_ids = m.stop_token_ids or []
    if not all(0 <= t < vocab_size for t in stop_ids):
        raise bad(f"'stop_token_ids' must be token ids in 0..{vocab_size - 1}", "stop_token_ids")
    stream = bool(m.stream)
    # stream_options without stream=true has nothing to act on and is ignored: /openapi.json cannot
    # say "only with stream" in a way schema fuzzers honour, and a schema-valid body is served.
    g = GenRequest(
        kind=kind,
        model=m.model,
        prompts=[],
        prompt_texts=[],
        max_tokens=_pick(m.max_completion_tokens, m.max_tokens),
        max_tokens_asked={k: v for k in ("max_tokens", "max_completion_tokens") if (v := getattr(m, k)) is not None},
        n=_pick(m.n, default=1),
        params=params,
        stop=stop,
        stop_token_ids=stop_ids,
        ignore_eos=bool(m.ignore_eos),
        min_tokens=_pick(m.min_tokens, default=0),
        stream=stream,
        include_usage=bool(m.stream_options is not None and m.stream_options.include_usage),
        skip_special_tokens=_pick(m.skip_special_tokens, default=True),
        include_stop_str_in_output=bool(m.include_stop_str_in_output),
    )
    return g, m


def parse_completion(body: dict, tokenizer, vocab_size: int, defaults: dict | None = None) -> GenRequest:
    g, m = parse_common(body, "completion", vocab_size, defaults)
    prompt = m.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        items = [prompt]
    else:
        items = prompt
    for item in items:
        if isinstance(item, str):
            g.prompts.append(tokenizer.encode(item))
            g.prompt_texts.append(item)
        else:
            badid = next((t for t in item if not 0 <= t < vocab_size), None)
            if badid is not None:
                raise bad(f"token id {badid} in 'prompt' is outside the vocabulary (0..{vocab_size - 1})", "prompt")
            g.prompts.append(list(item))
            g.prompt_texts.append(tokenizer.decode(item, skip_special=False))
    g.logprobs = m.logprobs
    g.echo = bool(m.echo)
    # echo with logprobs scores the echoed prompt too (lm-eval-harness' loglikelihood request);
    # vLLM's prompt_logprobs asks for them by itself. One engine pass serves both at the larger k.
    g.prompt_logprobs = m.prompt_logprobs
    asks = [k for k in (g.prompt_logprobs, g.logprobs if g.echo else None) if k is not None]
    g.score_prompt = max(asks) if asks else None
    constrain(g, body, tokenizer)
    return g


def constrain(g: GenRequest, body: dict, tokenizer) -> None:
    """The output constraint the request asks for (server/structured.py), or its forced tool
    call, compiled onto its sampling params."""
    from .structured import check_writable, compile_for, requested

    ask = requested(body)
    if ask is not None:
        check_writable(body, tokenizer)
    if g.tools is not None and g.tools.grammar is not None:
        if ask is None:
            ask = (g.tools.grammar, "the tools' call grammar", "tools")
        elif g.tools.choice != "auto":  # auto's grammar only guards calls: the asked shape wins
            raise bad(f"a forced tool call ('tool_choice') and '{ask[2]}' cannot both shape the answer", ask[2])
    if ask is not None:
        g.params = replace(g.params, grammar=compile_for(tokenizer, *ask))


def _message_text(m: ChatMessage) -> str:
    c = m.content
    if c is None or isinstance(c, str):
        return c or ""
    return "\n".join(p.text for p in c)  # text parts joined as vLLM joins them for a template that takes strings


@dataclass
class TemplateOptions:
    """How a request asks its messages to be rendered (vLLM's fields)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: dict = field(default_factory=dict)  # chat_template_kwargs: extra variables for the template


def template_options(m, rendered: bool = True) -> TemplateOptions:
    """A validated chat (or tokenize) request's template fields. As in vLLM, chat_template_kwargs
    may also carry add_generation_prompt / continue_final_message, and then they win. `rendered`
    False (a /tokenize `prompt`, which no template renders): the flags' types are checked, as the
    schema declares them everywhere, but not their pairing, which binds only with messages."""
    o = TemplateOptions(
        _pick(m.add_generation_prompt, default=True), bool(m.continue_final_message), dict(m.chat_template_kwargs or {})
    )
    for name in ("add_generation_prompt", "continue_final_message"):
        if name in o.kwargs:
            v = o.kwargs.pop(name)
            if not isinstance(v, bool):
                raise bad(f"'chat_template_kwargs.{name}': Input should be a valid boolean", "chat_template_kwargs")
            setattr(o, name, v)
    if rendered and o.add_generation_prompt and o.continue_final_message:
        raise bad(
            "'continue_final_message' needs 'add_generation_prompt': false (they cannot both be true)",
            "continue_final_message",
        )
    return o


def chat_prompt(
    messages: list[ChatMessage], tokenizer, options: TemplateOptions | None = None, tools=None
) -> tuple[str, list[int]]:
    """The chat template's text for `messages` and its token ids; `tools`: the request's
    ToolPlan (server/tools.py), rendered by the template or as the family's system prompt."""
    from .tool_formats import format_for
    from .tools import template_messages

    o = options or TemplateOptions()
    clean = []
    for m in messages:
        d = {"role": "system" if m.role == "developer" else m.role, "content": _message_text(m)}
        if m.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        for k in ("tool_call_id", "name"):
            if getattr(m, k) is not None:
                d[k] = getattr(m, k)
        clean.append(d)
    fmt = tools.fmt if tools is not None else format_for(tokenizer.chat_template, None)
    clean = template_messages(clean, tools, fmt)
    native = [t for t in tools.tools] if tools is not None and tools.template_tools else None
    try:
        text = tokenizer.render_chat(
            clean,
            add_generation_prompt=o.add_generation_prompt,
            continue_final_message=o.continue_final_message,
            template_kwargs=o.kwargs,
            tools=native,
        )
    except ValueError as e:  # ChatTemplateError names its field; anything else is the messages'
        raise bad(str(e), getattr(e, "param", "messages")) from e
    return text, tokenizer.encode(text, add_bos=tokenizer.add_bos)


def parse_chat(body: dict, tokenizer, vocab_size: int, defaults: dict | None = None) -> GenRequest:
    from .tools import plan

    g, m = parse_common(body, "chat", vocab_size, defaults)
    g.tools = plan(body, tokenizer)
    if g.tools is not None and g.tools.fmt.keeps_special:  # its calls open with a control token
        g.skip_special_tokens = False
    options = template_options(m)
    if m.reasoning_effort is not None:  # a template variable, as vLLM passes it (gpt-oss reads it)
        options.kwargs.setdefault("reasoning_effort", m.reasoning_effort)
    text, ids = chat_prompt(m.messages, tokenizer, options, g.tools)
    g.prompts, g.prompt_texts = [ids], [text]
    constrain(g, body, tokenizer)
    if m.logprobs:
        g.logprobs = _pick(m.top_logprobs, default=0)
    g.prompt_logprobs = g.score_prompt = m.prompt_logprobs  # vLLM's, beside the choices
    # top_logprobs without logprobs: true asks for nothing (ignored, as stream_options above).
    return g
