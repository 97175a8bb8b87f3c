"""A thinking model's reasoning split from its answer (server/reasoning.py): on text directly, and
over HTTP on a tiny random Qwen3 checkpoint whose answer a regex forces through `</think>`."""

from __future__ import annotations

import json
import shutil

import openai
import pytest

from live import MODEL, post
from tailgate.server.reasoning import ReasoningSplit, opened, split, thinks

CASES = [
    # (answer, prompt opened the thinking, reasoning_content, content)
    ("<think>\nweigh it\n</think>\n\nParis", False, "\nweigh it\n", "\n\nParis"),
    ("  <think>a</think>b", False, "a", "b"),
    ("weigh it\n</think>\n\nParis", True, "weigh it\n", "\n\nParis"),
    ("<think>cut short", False, "cut short", None),
    ("cut short", True, "cut short", None),
    ("Paris", False, None, "Paris"),
    ("Paris </think> and <think>", False, None, "Paris </think> and <think>"),
    ("<thin", False, None, "<thin"),
    ("", False, None, ""),
    ("<think></think>", False, "", None),
    ("<think>a</thin</think>b", False, "a</thin", "b"),
]


@pytest.mark.parametrize("text,inside,reasoning,content", CASES)
def test_a_whole_answer_splits_into_reasoning_and_content(text, inside, reasoning, content):
    assert split(text, inside) == (reasoning, content)


@pytest.mark.parametrize("text,inside,reasoning,content", CASES)
def test_a_streamed_answer_splits_as_the_whole_does_however_it_is_cut(text, inside, reasoning, content):
    for size in (1, 2, 3, 5):
        s = ReasoningSplit(inside)
        r = c = ""
        for i in range(0, len(text), size):
            a, b = s.push(text[i : i + size])
            r, c = r + a, c + b
        a, b = s.finish()
        r, c = r + a, c + b
        assert r == (reasoning or "") and c == (content or ""), size


def test_only_a_thinking_family_with_a_thinking_template_is_split():
    t = "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}...</think>"
    assert (
        thinks("qwen3", t)
        and not thinks("qwen2", t)
        and not thinks("qwen3", "<|im_start|>")
        and not thinks("qwen3", None)
    )
    assert opened("<|im_start|>assistant\n<think>\n") and not opened("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reasoning_effort_is_accepted_on_chat_and_refused_on_completions(server, client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=2, reasoning_effort="low"
    )
    assert r.choices[0].message.role == "assistant"
    bad = post(server[0], "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "reasoning_effort": "low"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
    bad = post(
        server[0], "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "lots"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"


# A Qwen3 thinking-only template (Qwen3-*-Thinking-2507's shape): the generation prompt opens <think>.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    "{# an answer's thinking ends with </think> #}"
)
FORCED = "Rivers flow\\.\n</think>\n\nNile"  # the regex the answer is held to


def test_a_qwen3_thinking_answer_comes_back_split_whole_and_streamed(loaded, tmp_path):
    import families_tiny
    from live import start_server, stop_server

    loaded("smollm2-135m").tokenizer._tok.save(str(tmp_path / "smollm2.json"))
    tok = families_tiny.tiny_tokenizer(tmp_path / "smollm2.json", tmp_path / "tokenizer.json")
    d = families_tiny.build(tmp_path / "qwen3-thinking", "qwen3", tok)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": THINKING_TEMPLATE}))
    p, base, _ = start_server(args=["--model", str(d)])
    try:
        c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        ask = dict(
            model=d.name,
            messages=[{"role": "user", "content": "Longest river?"}],
            max_tokens=64,
            temperature=0,
            extra_body={"guided_regex": FORCED},
        )
        m = c.chat.completions.create(**ask).choices[0].message
        assert (m.reasoning_content, m.content) == ("Rivers flow.\n", "\n\nNile")
        chunks = list(c.chat.completions.create(**ask, stream=True))
        deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
        reasoning = "".join(getattr(x, "reasoning_content", None) or "" for x in deltas)
        content = "".join(x.content or "" for x in deltas)
        assert (reasoning, content) == ("Rivers flow.\n", "\n\nNile")
        assert "</think>" not in content and "</think>" not in reasoning
    finally:
        stop_server(p)
        shutil.rmtree(d, ignore_errors=True)
