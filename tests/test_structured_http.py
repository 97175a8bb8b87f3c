"""Structured outputs, tool calls and logit_bias through the official `openai` SDK on
SmolLM2-135M-Instruct (the chat model issue 28 names; its server starts in a few seconds and
llguidance reads its 49k vocabulary in 1-3 s, where Gemma's 262k takes 8-40 s). Sampled answers
(temperature 1, several seeds) must always parse and validate; bad asks are 400s that name the
field and leave the server serving."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from live import post, wait_idle

PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "role", "tags", "home"],
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
        "home": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string", "maxLength": 10}},
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def smol(smol_server):
    c = openai.OpenAI(base_url=smol_server + "/v1", api_key="unused", max_retries=0)
    return c, c.models.list().data[0].id, smol_server


def test_sampled_json_schema_answers_always_parse_and_validate(smol):
    c, model, _ = smol
    # n=2 with seed 1: two answers drawn with seeds 1 and 2 in one batch (tests/test_constraint.py
    # draws more seeds at the sampler, where no forward pass is paid)
    r = c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Invent a user of our website."}],
        n=2,
        seed=1,
        temperature=1.0,
        max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    for ch in r.choices:
        assert ch.finish_reason == "stop", ch.message.content
        jsonschema.validate(json.loads(ch.message.content), PERSON)


def test_guided_choice_regex_and_json_object_hold_their_shape(smol):
    c, model, _ = smol
    say = [{"role": "user", "content": "Is the sky blue?"}]
    r = c.chat.completions.create(
        model=model, messages=say, temperature=1.0, seed=2, max_tokens=10, extra_body={"guided_choice": ["yes", "no"]}
    )
    assert r.choices[0].message.content in ("yes", "no") and r.choices[0].finish_reason == "stop"
    r = c.completions.create(
        model=model,
        prompt="A zip code:",
        temperature=1.0,
        seed=3,
        max_tokens=10,
        extra_body={"structured_outputs": {"regex": "[0-9]{5}"}},
    )
    assert len(r.choices[0].text) == 5 and r.choices[0].text.isdigit() and r.choices[0].finish_reason == "stop"
    r = c.chat.completions.create(
        model=model, messages=say, temperature=1.0, seed=4, max_tokens=60, response_format={"type": "json_object"}
    )
    assert r.choices[0].message.content.startswith("{")
    if r.choices[0].finish_reason == "stop":  # an object may outgrow 60 tokens; when it ends, it parses
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_tool_choice_required_calls_a_tool_with_valid_arguments_and_the_result_turn_is_served(smol):
    c, model, _ = smol
    r = c.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=5,
        max_tokens=60,
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    follow = ASK + [
        ch.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    r2 = c.chat.completions.create(model=model, messages=follow, tools=[WEATHER], temperature=0, max_tokens=12)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens


def test_a_named_function_streams_as_openai_deltas_whose_arguments_validate(smol):
    c, model, _ = smol
    chunks = list(
        c.chat.completions.create(
            model=model,
            messages=ASK,
            tools=[WEATHER],
            stream=True,
            temperature=1.0,
            seed=6,
            max_tokens=60,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    )
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "stop"  # OpenAI's for a forced named function


def test_required_streamed_ends_with_tool_calls(smol):
    c, model, _ = smol
    chunks = list(
        c.chat.completions.create(
            model=model,
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            stream=True,
            temperature=1.0,
            seed=7,
            max_tokens=60,
        )
    )
    carrying = [ch for ch in chunks if ch.choices[0].delta.tool_calls]
    deltas = [d for ch in carrying for d in ch.choices[0].delta.tool_calls]
    assert {d.index for d in deltas} == {0} and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert deltas[0].id and deltas[0].function.name == "get_weather" and deltas[0].function.arguments == ""
    assert len(carrying) >= 3  # the arguments streamed as the model wrote them, not in one piece at the end
    jsonschema.validate(json.loads("".join(d.function.arguments for d in deltas)), WEATHER["function"]["parameters"])
    assert not any(ch.choices[0].delta.content for ch in chunks)


def test_logit_bias_of_100_forces_the_token(smol):
    c, model, base = smol
    r = post(
        base,
        "/v1/completions",
        {"prompt": "Hello", "max_tokens": 3, "temperature": 1.0, "logit_bias": {"330": 100}, "logprobs": 0},
    )
    assert r.status_code == 200
    piece = post(base, "/detokenize", {"tokens": [330]}).json()["prompt"]
    assert r.json()["choices"][0]["logprobs"]["tokens"] == [piece] * 3


@pytest.mark.parametrize(
    "body,param,says",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}},
                }
            },
            "response_format",
            "not",
        ),
        ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json", "uniqueItems"),
        ({"guided_regex": "[0-9]+", "guided_choice": ["a"]}, "guided_choice", "one output constraint"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias", "token id"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "name",
        ),
        ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "guided_regex", "forced tool call"),
        ({"structured_outputs": {"grammar": "start: ("}}, "structured_outputs", "grammar"),
    ],
)
def test_an_ask_the_server_cannot_enforce_is_a_400_naming_it_and_the_server_serves_on(smol, body, param, says):
    c, model, base = smol
    r = post(base, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err
    assert wait_idle(base) == 0
    ok = post(base, "/v1/chat/completions", {"messages": ASK, "max_tokens": 1})
    assert ok.status_code == 200


AUTO_ASKS = [
    "What is the weather in Paris?",
    "Is it raining in Oslo right now? Use the tool.",
    "Tell me a joke about cats.",
    "Get the weather for Rome in fahrenheit.",
    "What is 2 + 2?",
    "Check the forecast for Madrid, please.",
]


def test_tool_choice_auto_answers_text_or_a_schema_valid_call_never_a_broken_call(smol):
    """`auto` under its grammar (issue 37): each answer, sampled, is plain text that holds no call
    opener, or calls whose arguments validate; a half-formed call is never handed back as content."""
    c, model, _ = smol
    called = 0
    for i, ask in enumerate(AUTO_ASKS):
        r = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": ask}],
            tools=[WEATHER],
            tool_choice="auto",
            temperature=1.0,
            seed=i,
            max_tokens=80,
        )
        ch = r.choices[0]
        if ch.message.tool_calls:
            called += 1
            assert ch.finish_reason == "tool_calls", ch
            for call in ch.message.tool_calls:
                assert call.function.name == "get_weather"
                jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        else:
            assert "<tool_call>" not in (ch.message.content or ""), ch  # SmolLM2's opener
    print(f"{called} of {len(AUTO_ASKS)} answers called the tool")
