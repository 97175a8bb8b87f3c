"""/v1/responses (server/responses.py) through the openai SDK's `client.responses.create`, against
the SmolLM2 instruct server: the same answer as the chat path, whole and streamed, with tools."""

from __future__ import annotations

import json

import openai
import pytest

from live import post

TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def smol(smol_server):
    c = openai.OpenAI(base_url=smol_server + "/v1", api_key="none", max_retries=0)
    return c, c.models.list().data[0].id


def test_a_response_is_the_chat_answer_to_the_same_messages(smol):
    c, model = smol
    r = c.responses.create(
        model=model, instructions="Answer briefly.", input="Name a colour.", max_output_tokens=12, temperature=0
    )
    chat = c.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}],
        max_tokens=12,
        temperature=0,
    )
    assert r.object == "response" and r.output_text == chat.choices[0].message.content
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    items = c.responses.create(
        model=model,
        input=[
            {"role": "system", "content": "Answer briefly."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
        ],
        max_output_tokens=12,
        temperature=0,
    )
    assert items.output_text == r.output_text


def test_a_streamed_response_sends_the_typed_events_and_the_same_text(smol):
    c, model = smol
    ask = dict(model=model, input="Count to 5.", max_output_tokens=10, temperature=0)
    whole = c.responses.create(**ask)
    events = list(c.responses.create(**ask, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete") and "response.output_text.done" in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text and events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_a_forced_function_tool_comes_back_as_a_function_call_item_whole_and_streamed(smol):
    c, model = smol
    ask = dict(
        model=model,
        input="Weather in Paris?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    )
    r = c.responses.create(**ask)
    calls = [o for o in r.output if o.type == "function_call"]
    assert (
        len(calls) == 1
        and calls[0].name == "get_weather"
        and json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo")
    )
    events = list(c.responses.create(**ask, stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert len(done) == 1 and done[0].arguments == args == calls[0].arguments
    final = [o for o in events[-1].response.output if o.type == "function_call"]
    assert final[0].name == "get_weather" and final[0].arguments == calls[0].arguments
    # the call's output goes back in as an item, and the model answers
    again = c.responses.create(
        model=model,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
        ],
        max_output_tokens=8,
    )
    assert again.status in ("completed", "incomplete")


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"type": "image", "url": "x"}]}, "input"),
        ({"input": ""}, "input"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_a_bad_responses_request_is_a_400_naming_its_field(smol_server, body, param):
    r = post(smol_server, "/v1/responses", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
