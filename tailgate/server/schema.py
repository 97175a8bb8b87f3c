"""The wire shapes: pydantic models of the requests we take and the responses we send.

Requests are validated strictly (no "1" for 1, no true for 1, no NaN or Infinity: JSON has
neither) against the ranges vLLM and OpenAI document; unknown fields are kept so that
`protocol.py` can refuse the ones we do not implement by name and ignore the harmless rest.
The response models document `/openapi.json`; the routes build the same shapes as plain dicts
(one pass, no re-validation on the hot path), and the tests hold the two together. What a model
cannot say (fields read from the raw body, rules across fields) is added from `schema_rules.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from . import schema_rules

I64_MAX, U64_MAX = (1 << 63) - 1, (1 << 64) - 1
MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP, MAX_STOP_CHARS = 16, 256  # stop strings: each token re-scans a hold-back of that length


def _integral(v):
    """JSON Schema counts 5.0 as an integer, so we do too (but not 5.5, "5" or true)."""
    return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**63 else v


def Int(**bounds):
    """An integer within `bounds` (the bounds first: so the JSON schema says minimum/maximum)."""
    return Annotated[int, Field(**bounds), BeforeValidator(_integral)]


# The vocabulary's bound is the served model's: app.py's /openapi.json fills it in where this marks.
TokenId = Annotated[int, Field(ge=0, json_schema_extra={"x-tailgate-token-id": True}), BeforeValidator(_integral)]
# So is the context's: at most MAX_CONTEXT - 1 (a prompt takes one); a prompt that leaves less room
# ends the answer there (finish "length"), since no schema can say how many tokens a prompt is.
CONTEXT = {"x-tailgate-context": True}
Text = Annotated[str, Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool | None = None


class _Sampling(_Strict):
    """Fields both generation endpoints share."""

    model: str | None = None
    max_tokens: Int(ge=1, json_schema_extra=CONTEXT) | None = None
    max_completion_tokens: Int(ge=1, json_schema_extra=CONTEXT) | None = None
    temperature: float | None = Field(None, ge=0, le=2, description="< 1e-5 is greedy (as vLLM)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: Int(ge=-1, le=I64_MAX) | None = Field(None, description="0 or -1: off")
    min_p: float | None = Field(None, ge=0, le=1)
    seed: Int(ge=-I64_MAX - 1, le=U64_MAX) | None = None
    n: Int(ge=1, le=MAX_N) | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    stop: (
        Annotated[str, Field(max_length=MAX_STOP_CHARS)]
        | Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOP)]
        | None
    ) = Field(None, description="empty strings stop nothing (they still count toward the 16)")
    stop_token_ids: list[TokenId] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    min_tokens: Int(ge=0) | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    user: str | None = None


class CompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra=schema_rules.completion_extra)
    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = None
    echo: bool | None = None
    max_tokens: Int(ge=0, json_schema_extra=CONTEXT) | None = Field(
        None, description="0: no completion, only the prompt's echo and logprobs"
    )
    prompt_logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = Field(
        None, description="vLLM's: each prompt token's logprob and rank, with the top k"
    )


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str = Field(description="the arguments as a JSON object, serialized")


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant turn's calls (server/tools.py)")
    tool_call_id: str | None = Field(None, description="a tool turn: the call it answers")
    name: str | None = None


class _ChatTemplateFields(_Strict):
    """vLLM's chat-template fields (chat and tokenize)."""

    add_generation_prompt: bool | None = Field(None, description="default true")
    continue_final_message: bool | None = Field(None, description="needs add_generation_prompt false")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="extra variables for the chat template")


class ChatCompletionRequest(_Sampling, _ChatTemplateFields):
    model_config = ConfigDict(json_schema_extra=schema_rules.chat_extra)
    messages: list[ChatMessage] = Field(min_length=1)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="passed to the chat template as `reasoning_effort` (as vLLM passes it)"
    )
    logprobs: bool | None = None
    top_logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = None
    prompt_logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = Field(
        None, description="vLLM's: each prompt token's logprob and rank, with the top k (beside the choices)"
    )


class TokenizeRequest(_ChatTemplateFields):
    """`prompt` or `messages`."""

    model_config = ConfigDict(json_schema_extra=schema_rules.tokenize_extra)
    # Either may be left out, but not sent as null: the schema says string / array, and the
    # server holds to it (schemathesis' negative cases check that it refuses what the schema does).
    prompt: str | SkipJsonSchema[None] = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | SkipJsonSchema[None] = None
    add_special_tokens: bool | None = None

    @field_validator("prompt", "messages", mode="before")
    @classmethod
    def _not_null(cls, v):
        if v is None:
            raise ValueError("must be a value when given (leave it out instead of null)")
        return v


class DetokenizeRequest(_Strict):
    tokens: list[TokenId]


MAX_EMBED_INPUTS = 2048  # OpenAI's bound on an embeddings request's inputs
# The served model's hidden size: app.py's /openapi.json fills it in (`dimensions` must equal it).
HIDDEN = {"x-tailgate-hidden": True}


class EmbeddingRequest(_Strict):
    """OpenAI's embeddings request; every input is pooled from the served model's final hidden
    state (server/embeddings.py)."""

    model: str | None = None
    input: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=MAX_EMBED_INPUTS)
        ]
    )
    encoding_format: Literal["float", "base64"] | None = Field(
        None, description="base64: each vector's little-endian float32 bytes (default float)"
    )
    dimensions: Int(ge=1, json_schema_extra=HIDDEN) | None = Field(
        None, description="only the model's own hidden size (no truncation)"
    )
    user: str | None = None
    add_special_tokens: bool | None = Field(
        None, description="vLLM's: the tokenizer's BOS on text inputs (default true)"
    )


class ResponsesRequest(_Strict):
    """OpenAI's Responses request, served through the chat path (server/responses.py): `input` a
    string or a list of items (message, function_call, function_call_output; reasoning items are
    skipped), function tools only, nothing stored."""

    model: str | None = None
    input: Text | Annotated[list[dict[str, Any]], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Int(ge=1, json_schema_extra=CONTEXT) | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[dict[str, Any]] | None = Field(None, description="function tools: {type: function, name, parameters}")
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    reasoning: dict[str, Any] | None = Field(None, description="{effort}: passed to the template as reasoning_effort")
    text: dict[str, Any] | None = Field(None, description="{format: text | json_schema | json_object}")
    previous_response_id: str | None = Field(None, description="refused: responses are not stored")
    store: bool | None = Field(None, description="accepted; nothing is stored")
    metadata: dict[str, str] | None = None
    user: str | None = None


# ---- responses (documentation of what the routes send) -----------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict | None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = Field(None, description="a thinking model's reasoning (server/reasoning.py)")
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict | None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: list | None = Field(
        None,
        description="vLLM's, when asked: per prompt token (the first null) "
        "a map of token id to logprob, rank and decoded_token",
    )


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: dict | None
    finish_reason: str | None


class CompletionChunk(BaseModel):
    """One event of a streamed completion (`data: {chunk}`); the last, with
    `stream_options.include_usage`, has no choices and the usage."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict] | None = Field(None, description="OpenAI's streamed call deltas (index, id, type, function)")


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: dict | None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed chat completion (`data: {chunk}`)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32 bytes")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ResponseObject(BaseModel):
    """A Response (OpenAI's Responses API); streamed, typed events carry it (`response.created`,
    `response.completed`, ...) between the items' own events."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "in_progress"]
    model: str
    output: list[dict]
    usage: dict | None = None
    incomplete_details: dict | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int | str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


REQUESTS = (
    CompletionRequest,
    ChatCompletionRequest,
    TokenizeRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    ResponsesRequest,
)
# Published beside the requests: what a stream's events carry (routes/generation.py's SSE schema).
STREAMED = (CompletionChunk, ChatCompletionChunk, ErrorResponse)
