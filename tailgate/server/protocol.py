"""Request parsing and validation for /v1/completions and /v1/chat/completions.

Fail closed: a field we would silently drop is refused with a 400; harmless extras that common
clients send are accepted and ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.request import SamplingParams


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}
        self.type = type_ or {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                              429: "RateLimitError", 503: "ServiceUnavailableError"}.get(
            status, "BadRequestError" if status < 500 else "InternalServerError")
        self.code = code if code is not None else status

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


# Fields whose meaning we do not implement (OpenAI's and vLLM's extra parameters): refusing beats
# silently ignoring them. Set means anything but null / an empty string, list or object: 0 and
# false are values (`prompt_logprobs: 0` asks for something).
_REFUSED_IF_SET = ("suffix", "tools", "tool_choice", "functions", "function_call", "guided_json", "guided_regex",
                   "guided_choice", "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern",
                   "structured_outputs", "prompt_logprobs", "audio", "prediction", "lora_request", "response_format",
                   "logit_bias", "bad_words", "allowed_token_ids", "truncate_prompt_tokens", "chat_template",
                   "chat_template_kwargs", "documents", "mm_processor_kwargs", "logits_processors", "priority",
                   "kv_transfer_params", "vllm_xargs", "cache_salt", "modalities", "reasoning_effort",
                   "web_search_options", "parallel_tool_calls")
# Fields we accept only at the value that means what we do.
_REFUSED_UNLESS = {"use_beam_search": False, "length_penalty": 1, "continue_final_message": False,
                   "spaces_between_special_tokens": True, "return_tokens_as_token_ids": False}
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
    n: int = 1
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


def _typed(body: dict, key: str, types, default=None, what: str = ""):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise bad(f"'{key}' must be {what}, got {v!r}", key)
    if not isinstance(v, types):
        raise bad(f"'{key}' must be {what}, got {type(v).__name__}", key)
    return v


_I64_MAX, _U64_MAX = (1 << 63) - 1, (1 << 64) - 1
MAX_STOP_CHARS = 256


def _number(body, key, default, lo=None, hi=None, lo_open=False, integer=False):
    v = _typed(body, key, int if integer else (int, float), default, "an integer" if integer else "a number")
    if v is None:
        return None
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise bad(f"'{key}' must be {'>' if lo_open else '>='} {lo}, got {v}", key)
    if hi is not None and v > hi:
        raise bad(f"'{key}' must be <= {hi}, got {v}", key)
    return v


def parse_common(body: dict, kind: str, vocab_size: int) -> GenRequest:
    for k in _REFUSED_IF_SET:
        v = body.get(k)
        if _is_set(v) and not (k == "response_format" and isinstance(v, dict) and v.get("type") == "text"):
            raise bad(f"'{k}' is not supported by this server", k)
    for k, ok in {**_REFUSED_UNLESS, "add_special_tokens": _SPECIAL_TOKENS[kind]}.items():
        v = body.get(k)
        if v is not None and (isinstance(v, bool) != isinstance(ok, bool) or v != ok):
            raise bad(f"'{k}': only {str(ok).lower()} is supported by this server, got {v!r}", k)
    if body.get("best_of") not in (None, 1) and body.get("best_of") != body.get("n", 1):
        raise bad("'best_of' other than n is not supported", "best_of")
    model = _typed(body, "model", str, None, "a string")
    max_tokens = _number(body, "max_completion_tokens", None, lo=1, integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", None, lo=1, integer=True)
    temperature = _number(body, "temperature", 1.0, lo=0, hi=2)
    top_p = _number(body, "top_p", 1.0, lo=0, hi=1, lo_open=True)
    top_k = _number(body, "top_k", 0, lo=-1, hi=_I64_MAX, integer=True)
    min_p = _number(body, "min_p", 0.0, lo=0, hi=1)
    seed = _number(body, "seed", None, lo=-_I64_MAX - 1, hi=_U64_MAX, integer=True)  # torch's seed range
    n = _number(body, "n", 1, lo=1, hi=16, integer=True)
    params = SamplingParams(
        temperature=float(temperature), top_k=int(top_k) if top_k > 0 else 0, top_p=float(top_p), min_p=float(min_p),
        seed=seed, presence_penalty=float(_number(body, "presence_penalty", 0.0, lo=-2, hi=2)),
        frequency_penalty=float(_number(body, "frequency_penalty", 0.0, lo=-2, hi=2)),
        repetition_penalty=float(_number(body, "repetition_penalty", 1.0, lo=0, lo_open=True, hi=10)))
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad("'stop' must be a string or a list of strings", "stop")
    stop = [s for s in stop if s]
    if len(stop) > 16:
        raise bad("'stop' takes at most 16 strings", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):  # each token re-scans a hold-back of this length
        raise bad(f"each 'stop' string takes at most {MAX_STOP_CHARS} characters", "stop")
    stop_ids = _typed(body, "stop_token_ids", list, [], "a list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in stop_ids):
        raise bad(f"'stop_token_ids' must be token ids in 0..{vocab_size - 1}", "stop_token_ids")
    so = _typed(body, "stream_options", dict, {}, "an object")
    stream = bool(_typed(body, "stream", bool, False, "a boolean"))
    if so and not stream:
        raise bad("'stream_options' is only allowed with stream=true", "stream_options")
    return GenRequest(
        kind=kind, model=model, prompts=[], prompt_texts=[], max_tokens=max_tokens, n=n, params=params, stop=stop,
        stop_token_ids=stop_ids, ignore_eos=bool(_typed(body, "ignore_eos", bool, False, "a boolean")),
        min_tokens=_number(body, "min_tokens", 0, lo=0, integer=True), stream=stream,
        include_usage=bool(so.get("include_usage", False)),
        skip_special_tokens=bool(_typed(body, "skip_special_tokens", bool, True, "a boolean")),
        include_stop_str_in_output=bool(_typed(body, "include_stop_str_in_output", bool, False, "a boolean")))


def parse_completion(body: dict, tokenizer, vocab_size: int) -> GenRequest:
    g = parse_common(body, "completion", vocab_size)
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("'prompt' is required", "prompt")
    if isinstance(prompt, str):
        items = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        items = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) and p and all(
            isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
        items = prompt
    else:
        raise bad("'prompt' must be a string, a list of strings, a list of token ids, or a list of those", "prompt")
    for item in items:
        if isinstance(item, str):
            if not item:
                raise bad("'prompt' must not be empty", "prompt")
            g.prompts.append(tokenizer.encode(item))
            g.prompt_texts.append(item)
        else:
            badid = next((t for t in item if not 0 <= t < vocab_size), None)
            if badid is not None:
                raise bad(f"token id {badid} in 'prompt' is outside the vocabulary (0..{vocab_size - 1})", "prompt")
            g.prompts.append(list(item))
            g.prompt_texts.append(tokenizer.decode(item, skip_special=False))
    lp = _number(body, "logprobs", None, lo=0, hi=20, integer=True)
    g.logprobs = lp
    g.echo = bool(_typed(body, "echo", bool, False, "a boolean"))
    if g.echo and lp is not None:
        raise bad("'echo' together with 'logprobs' (prompt logprobs) is not supported", "echo")
    return g


def _message_text(m: dict, i: int) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise bad(f"messages[{i}].content: only text parts are supported", "messages")
            parts.append(p["text"])
        return "".join(parts)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def parse_chat(body: dict, tokenizer, vocab_size: int) -> GenRequest:
    g = parse_common(body, "chat", vocab_size)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise bad(f"messages[{i}].role {role!r} is not supported (system, user, assistant)", "messages")
        clean.append({"role": role, "content": _message_text(m, i)})
    add_gen = bool(_typed(body, "add_generation_prompt", bool, True, "a boolean"))
    try:
        text = tokenizer.render_chat(clean, add_generation_prompt=add_gen)
    except ValueError as e:
        raise bad(str(e), "messages") from e
    g.prompts = [tokenizer.encode(text, add_bos=tokenizer.add_bos)]
    g.prompt_texts = [text]
    if _typed(body, "logprobs", bool, False, "a boolean"):
        g.logprobs = _number(body, "top_logprobs", 0, lo=0, hi=20, integer=True)
    elif body.get("top_logprobs") is not None:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return g
