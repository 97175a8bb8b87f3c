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
    sent, rest, ts = stream(CHATML_TEMPLATE, ["Let me check. <to", "ol_call>[", '{"name": "get_weather", ',
                                              '"arguments": {"city": "Paris"}}]</tool_call>'])
    assert "".join(sent) + rest == "Let me check. "
    assert sent[0] == "Let me check. "  # the "<to" that might open a call was held, nothing else
    (d0, d1) = ts.deltas()
    assert d0["index"] == d1["index"] == 0 and d0["id"].startswith("call_") and d0["type"] == "function"
    assert d0["function"] == {"name": "get_weather", "arguments": ""}
    assert json.loads(d1["function"]["arguments"]) == {"city": "Paris"}


def test_text_that_only_looked_like_a_call_is_given_back_whole():
    sent, rest, ts = stream(CHATML_TEMPLATE, ["a < b and <tool_call>[not json"])
    assert "".join(sent) + rest == "a < b and <tool_call>[not json" and not ts.calls
    sent, rest, ts = stream(GEMMA_TEMPLATE, ['```tool_code\n{"name": "launch_rockets", "parameters": {}}\n```'])
    assert rest.startswith("```tool_code") and not ts.calls  # a function the request did not offer


def test_a_forced_call_holds_every_piece_until_the_end():
    sent, rest, ts = stream(GEMMA_TEMPLATE, ["```tool_code\n", '{"name": "get_weather", "parameters": {"x": 1}}',
                                             "\n```"], choice="required")
    assert sent == ["", "", ""] and rest == ""
    assert [c["function"]["name"] for c in ts.calls] == ["get_weather"]


@pytest.mark.parametrize("body,param", [
    ({"tools": [FN], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [FN], "functions": [FN["function"]]}, "functions"),
    ({"tools": [FN], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_a_malformed_tools_ask_is_a_400_naming_the_field(body, param):
    from tailgate.model.weights import load_tokenizer
    from tailgate.server.tools import plan

    with pytest.raises(ApiError) as e:
        plan(body, load_tokenizer("smollm2-135m"))
    assert e.value.status == 400 and e.value.param == param


def test_tools_that_share_a_name_are_served_as_vllm_serves_them():
    # No JSON schema can say a list's names are unique, and vLLM does not ask it (66c5ad5): a
    # schema-valid body must not be refused.
    from tailgate.model.weights import load_tokenizer
    from tailgate.server.tools import plan

    p = plan({"tools": [FN, FN], "tool_choice": "required"}, load_tokenizer("smollm2-135m"))
    assert p is not None
