"""Reading an answer for tool calls as it streams (server/tools.py ToolStream), no model needed:
what is content reaches the client as it comes, what is a call is held and sent as OpenAI's
deltas, and anything that only looked like a call is given back as text."""

from __future__ import annotations

import json

import pytest

from tailgate.model.tokenizer import CHATML_TEMPLATE, GEMMA_TEMPLATE
from tailgate.server.protocol import ApiError
from tailgate.server.tool_formats import format_for
from tailgate.server.tools import ToolPlan, ToolStream

FN = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def stream(template, pieces, choice="auto"):
    ts = ToolStream(ToolPlan([FN], choice, format_for(template, None)))
    sent = [ts.push(p) for p in pieces]
    return sent, ts.finish(), ts


def test_auto_content_before_a_smollm2_call_flows_and_the_call_comes_back_as_deltas():
    sent, rest, ts = stream(
        CHATML_TEMPLATE,
        ["Let me check. <to", "ol_call>[", '{"name": "get_weather", ', '"arguments": {"city": "Paris"}}]</tool_call>'],
    )
    assert "".join(sent) + rest == "Let me check. "
    assert sent[0] == "Let me check. "  # the "<to" that might open a call was held, nothing else
    d0, *rest = ts.emitted
    assert d0["index"] == 0 and d0["id"].startswith("call_") and d0["type"] == "function"
    assert d0["function"] == {"name": "get_weather", "arguments": ""}
    assert all(d["index"] == 0 and set(d) == {"index", "function"} for d in rest)
    assert json.loads("".join(d["function"]["arguments"] for d in rest)) == {"city": "Paris"}
    assert ts.calls[0]["id"] == d0["id"]


def arguments(deltas, index=0) -> str:
    return "".join(d["function"]["arguments"] for d in deltas if d["index"] == index)


@pytest.mark.parametrize(
    "template,pieces",
    [
        (
            CHATML_TEMPLATE,
            [
                '<tool_call>[{"name": "get_',
                'weather", "arguments": {"ci',
                'ty": "Par',
                'is", "days": 3',
                "}}]</tool_call>",
            ],
        ),
        (
            GEMMA_TEMPLATE,
            ['```tool_code\n{"name": "get_weather", ', '"parameters": {"city": ', '"Paris", "days": 3}}', "\n```"],
        ),
    ],
)
def test_a_calls_arguments_stream_as_the_model_writes_them_and_add_up_to_the_call(template, pieces):
    ts = ToolStream(ToolPlan([FN], "auto", format_for(template, None)))
    per_push = []
    for p in pieces:
        assert ts.push(p) == ""
        per_push.append(ts.take())
    assert ts.finish() == "" and ts.take() == []
    opened = next(i for i, d in enumerate(per_push) if d)
    assert per_push[opened][0]["function"] == {"name": "get_weather", "arguments": ""}  # as soon as the name closes
    assert sum(1 for d in per_push if d) >= 3  # the arguments came in pieces, not at the end
    raw = arguments(ts.emitted)
    assert raw == '{"city": "Paris", "days": 3}'  # the model's own text, fragment by fragment
    assert json.loads(raw) == json.loads(ts.calls[0]["function"]["arguments"])


def test_a_name_the_request_did_not_offer_opens_no_call_and_comes_back_as_text():
    ts = ToolStream(ToolPlan([FN], "auto", format_for(CHATML_TEMPLATE, None)))
    text = '<tool_call>[{"name": "launch_rockets", "arguments": {"n": 1}}]</tool_call>'
    assert ts.push(text) == "" and ts.take() == []
    assert ts.finish() == text and not ts.called


def test_arguments_written_before_the_name_go_out_when_the_name_closes():
    ts = ToolStream(ToolPlan([FN], "required", format_for(GEMMA_TEMPLATE, None)))
    ts.push('```tool_code\n{"parameters": {"city": "Oslo"}, ')
    assert ts.take() == []
    ts.push('"name": "get_weather"}\n```')
    d = ts.take()
    assert d[0]["function"]["name"] == "get_weather" and arguments(d) == '{"city": "Oslo"}'


def test_parallel_calls_stream_under_their_own_indexes():
    ts = ToolStream(ToolPlan([FN], "auto", format_for(CHATML_TEMPLATE, None)))
    ts.push('<tool_call>[{"name": "get_weather", "arguments": {"city": "A"}}, ')
    ts.push('{"name": "get_weather", "arguments": {"city": "B"}}]</tool_call>')
    ts.finish()
    assert [d["index"] for d in ts.emitted if "id" in d] == [0, 1]
    assert [c["id"] for c in ts.calls] == [d["id"] for d in ts.emitted if "id" in d]
    assert arguments(ts.emitted, 1) == '{"city": "B"}'


def test_arguments_written_as_a_json_string_go_out_whole_at_the_end():
    ts = ToolStream(ToolPlan([FN], "auto", format_for(CHATML_TEMPLATE, None)))
    ts.push('<tool_call>[{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}]</tool_call>')
    assert [d["function"].get("name") for d in ts.take()] == ["get_weather"]
    ts.finish()
    assert json.loads(arguments(ts.take())) == {"city": "Rome"}


def test_a_whole_answer_is_read_once_and_text_that_only_looked_like_a_call_stays_text():
    ts = ToolStream(ToolPlan([FN], "auto", format_for(CHATML_TEMPLATE, None)), live=False)
    text = '<tool_call>[{"name": "get_weather", "arguments": {"city": '
    assert ts.push(text) + ts.finish() == text and not ts.called and ts.emitted == []


def test_text_that_only_looked_like_a_call_is_given_back_whole():
    sent, rest, ts = stream(CHATML_TEMPLATE, ["a < b and <tool_call>[not json"])
    assert "".join(sent) + rest == "a < b and <tool_call>[not json" and not ts.calls
    sent, rest, ts = stream(GEMMA_TEMPLATE, ['```tool_code\n{"name": "launch_rockets", "parameters": {}}\n```'])
    assert rest.startswith("```tool_code") and not ts.calls  # a function the request did not offer


def test_a_forced_call_holds_every_piece_until_the_end():
    sent, rest, ts = stream(
        GEMMA_TEMPLATE,
        ["```tool_code\n", '{"name": "get_weather", "parameters": {"x": 1}}', "\n```"],
        choice="required",
    )
    assert sent == ["", "", ""] and rest == ""
    assert [c["function"]["name"] for c in ts.calls] == ["get_weather"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"tools": [FN], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": [FN], "functions": [FN["function"]]}, "functions"),
        ({"tools": [FN], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_a_malformed_tools_ask_is_a_400_naming_the_field(body, param):
    from tailgate.model.formats.weights import load_tokenizer
    from tailgate.server.tools import plan

    with pytest.raises(ApiError) as e:
        plan(body, load_tokenizer("smollm2-135m"))
    assert e.value.status == 400 and e.value.param == param


def test_tools_that_share_a_name_are_served_as_vllm_serves_them():
    # No JSON schema can say a list's names are unique, and vLLM does not ask it (66c5ad5): a
    # schema-valid body must not be refused.
    from tailgate.model.formats.weights import load_tokenizer
    from tailgate.server.tools import plan

    p = plan({"tools": [FN, FN], "tool_choice": "required"}, load_tokenizer("smollm2-135m"))
    assert p is not None


MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS] {{ m.tool_calls | tojson }}</s>{% else %}{{ m['content'] }}</s>{% endif %}"
    "{% endfor %}"
)


def test_a_mistral_template_is_read_as_mistral_and_both_its_call_shapes_parse():
    fmt = format_for(MISTRAL_TEMPLATE, None)
    assert fmt.name == "mistral" and fmt.keeps_special
    v03 = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "f", "arguments": {}}]</s>'
    v11 = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]f[ARGS]{}'
    want = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "f", "arguments": {}}]
    assert fmt.parse(v03) == ("", want) and fmt.parse(v11) == ("", want)
    assert fmt.parse("Checking. " + v11) == ("Checking.", want)
    assert fmt.parse("[TOOL_CALLS]get_weather{no args}") is None and fmt.parse("no call here") is None


def test_a_mistral_call_streams_as_deltas_after_its_control_token():
    sent, rest, ts = stream(
        MISTRAL_TEMPLATE, ["Sure. [TOOL_", 'CALLS][{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}]']
    )
    assert "".join(sent) + rest == "Sure. "
    assert [c["function"]["name"] for c in ts.calls] == ["get_weather"]
    assert json.loads(ts.calls[0]["function"]["arguments"]) == {"city": "Oslo"}
