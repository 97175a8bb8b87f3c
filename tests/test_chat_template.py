"""Chat prompts are rendered as HF transformers renders them (its own renderer, its variables), so
they are byte-equal to `apply_chat_template` and so to what vLLM sends; `--chat-template`
overrides the model's template and `chat_template_kwargs` reaches it."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import hf_reads_gguf_once
from live import post, start_server, stop_server
from tailgate.model.tokenizer import GEMMA_TEMPLATE, ChatTemplateError, load_chat_template
from tailgate.model.formats.weights import load_tokenizer, resolve_model_path
from tailgate.server.main import chat_template

ISSUE_EXAMPLE = "{% for m in messages %}\n{% if m.role == 'user' %}\n<u>{{ m.content }}\n{% endif %}\n{% endfor %}"
# What HF's environment has and a plain Jinja one lacks: trim_blocks / lstrip_blocks, loop
# controls, its tojson (no HTML escaping, ensure_ascii off), strftime_now, raise_exception, the
# named special tokens, and caller variables.
FEATURES = """{{ bos_token }}
{%- for m in messages %}
    {% if loop.index0 == 3 %}{% break %}{% endif %}
    {% if m.role == 'system' %}{% continue %}{% endif %}
{{ m.role }}={{ m | tojson }}
{% endfor %}
{% if enable_thinking %}<think>{% endif %}[{{ strftime_now('%Y') }}]{{ eos_token }}
{% if messages | length > 9 %}{{ raise_exception('too long') }}{% endif %}"""
CONVERSATION = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "Héllo! What is <b>2 & 2</b>?"},
    {"role": "assistant", "content": "  It is 4.  "},
    {"role": "user", "content": 'And 3 + 3? Say it "exactly".'},
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    """HF's own tokenizer for a shipped model, built by transformers from the same GGUF file
    (Gemma's 262k vocabulary: 32-36 s on a busy 2-core host, 18 s with conftest.hf_reads_gguf_once;
    once per module)."""
    cache = {}

    def get(name):
        if name not in cache:
            from transformers import AutoTokenizer

            path = resolve_model_path(name)
            with hf_reads_gguf_once():
                cache[name] = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return cache[name]

    return get


def test_the_issues_example_renders_as_transformers_renders_it():
    tok = load_tokenizer("smollm2-135m")
    tok.set_chat_template(ISSUE_EXAMPLE)
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "<u>hi\n"  # a plain Jinja env gave '\n\n<u>hi\n\n'


def test_a_tokenizer_imports_transformers_only_when_its_template_is_compiled():
    import subprocess
    import sys

    code = (
        "import sys; from tailgate.model.formats.weights import load_tokenizer; t = load_tokenizer('smollm2-135m'); "
        "print('transformers' in sys.modules); t.compile_chat_template(); print('transformers' in sys.modules, "
        "'torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["False", "True", "False"]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_the_shipped_models_chat_prompts_are_byte_equal_to_hf(name, hf_tokenizer):
    tok, hf = load_tokenizer(name), hf_tokenizer(name)
    if name == "gemma3-270m":
        # The GGUF carries no template (HF's tokenizer has none): tailgate serves Gemma's turn
        # format, and HF must render that same template identically.
        assert hf.chat_template is None and tok.chat_template == GEMMA_TEMPLATE
        theirs = {"chat_template": GEMMA_TEMPLATE}
    else:
        assert tok.chat_template == hf.chat_template  # the file's own template
        theirs = {}
    # The named special tokens the template sees are HF's (an old GGUF cache knows BOS and EOS only).
    assert {"bos_token", "eos_token"} <= tok.special_tokens.keys()
    assert tok.special_tokens.items() <= hf.special_tokens_map.items()
    for agp in (True, False):
        want = hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=agp, **theirs)
        assert tok.render_chat(CONVERSATION, add_generation_prompt=agp) == want
        want_ids = hf.apply_chat_template(
            CONVERSATION, tokenize=True, return_dict=False, add_generation_prompt=agp, **theirs
        )
        assert tok.encode_chat(CONVERSATION, add_generation_prompt=agp) == list(want_ids)
    want = hf.apply_chat_template(CONVERSATION[:3], tokenize=False, continue_final_message=True, **theirs)
    assert tok.render_chat(CONVERSATION[:3], add_generation_prompt=False, continue_final_message=True) == want
    assert want.rstrip().endswith("It is 4.")  # the reply is left open for the model to continue
    # HF's environment, every feature a plain Jinja one lacks, and caller variables.
    tok.set_chat_template(FEATURES)
    for kwargs in ({}, {"enable_thinking": True}, {"eos_token": "<end>"}):
        want = hf.apply_chat_template(CONVERSATION, chat_template=FEATURES, tokenize=False, **kwargs)
        assert tok.render_chat(CONVERSATION, add_generation_prompt=False, template_kwargs=kwargs) == want
    first = 'user={"role": "user", "content": "Héllo! What is <b>2 & 2</b>?"}\nassistant={'
    assert want.startswith(tok.special_tokens["bos_token"] + first) and want.endswith("]<end>\n")
    assert "<think>" not in want
    with pytest.raises(ChatTemplateError, match="too long"):
        tok.render_chat(CONVERSATION * 3)


def test_an_hf_directorys_template_and_special_tokens_are_the_ones_hf_reads(tmp_path):
    from types import SimpleNamespace

    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import WordLevel
    from transformers import AutoTokenizer

    from tailgate.model.formats.hf_loader import read_tokenizer_meta
    from tailgate.model.tokenizer import Tokenizer

    words = ["<unk>", "<s>", "</s>", "<pad>", "hi"]
    raw = RawTokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True},
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "chat_template": "{{ 'from tokenizer_config' }}",
            }
        )
    )
    jinja = (
        "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{{ eos_token }}{% endfor %}{{ pad_token }}"
        "{{ unk_token }}"
    )
    (tmp_path / "chat_template.jinja").write_text(jinja)  # HF reads this one first
    tok = Tokenizer(str(tmp_path / "tokenizer.json"), read_tokenizer_meta(tmp_path, SimpleNamespace(arch="llama")))
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok.chat_template == hf.chat_template == jinja
    assert tok.special_tokens == hf.special_tokens_map
    msgs = [{"role": "user", "content": "hi"}]
    assert (
        tok.render_chat(msgs)
        == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        == "<s>[hi]</s><pad><unk>"
    )


def test_a_chat_template_comes_from_a_file_or_inline_as_vllm_reads_it(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text(ISSUE_EXAMPLE)
    assert load_chat_template(str(f)) == ISSUE_EXAMPLE
    assert load_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"  # inline
    with pytest.raises(ValueError, match="looks like a file path but cannot be read"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="looks like a file path"):
        load_chat_template(str(tmp_path))  # a directory
    (tmp_path / "latin1.jinja").write_bytes(b"{{ '\xe9' }}")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_chat_template(str(tmp_path / "latin1.jinja"))
    (tmp_path / "empty.jinja").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_chat_template(str(tmp_path / "empty.jinja"))
    # The flag wins over TAILGATE_CHAT_TEMPLATE; each error names where the template came from.
    env = {"TAILGATE_CHAT_TEMPLATE": "{{ 'env' }}"}
    assert chat_template(None, env) == "{{ 'env' }}" and chat_template(str(f), env) == ISSUE_EXAMPLE
    assert chat_template(None, {}) is None and chat_template(None, {"TAILGATE_CHAT_TEMPLATE": ""}) is None
    with pytest.raises(ValueError, match=r"^--chat-template: the chat template does not compile: .*line 1"):
        chat_template("{% for m in messages %}", env)
    with pytest.raises(ValueError, match=r"^TAILGATE_CHAT_TEMPLATE: .*does not compile"):
        chat_template(None, {"TAILGATE_CHAT_TEMPLATE": "{{ }"})
    assert chat_template(
        "{% for m in messages %}{% break %}{% endfor %}{% generation %}x{% endgeneration %}", {}
    )  # HF's loop controls and generation tag compile


@pytest.mark.parametrize("value", ["missing.jinja", "{% if %}"])
def test_serve_refuses_a_bad_chat_template_before_anything_loads(value, tmp_path, monkeypatch, capsys):
    import tailgate.assemble as assemble
    from tailgate.cli import main as cli

    def loaded(*a, **k):
        raise AssertionError("the model was touched before the template was checked")

    monkeypatch.setattr(assemble, "preflight", loaded)  # the first thing that reads a model file
    monkeypatch.chdir(tmp_path)
    assert cli(["serve", "--chat-template", value, "--port", "0"]) == 2
    assert capsys.readouterr().err.startswith("tailgate: --chat-template: ")


def test_chat_template_overrides_the_models_over_http_and_its_kwargs_reach_it(tmp_path):
    f = tmp_path / "override.jinja"
    f.write_text(
        "{{ bos_token }}{% for m in messages %}\n{% if m.role == 'user' %}\n"
        "<start_of_turn>user\n{{ m.content }}<end_of_turn>\n{% endif %}\n{% endfor %}\n"
        "{% if enable_thinking %}\n[think]\n{% endif %}\n"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    p, base, _ = start_server(args=["--chat-template", str(f)])
    try:
        msgs = [{"role": "system", "content": "ignored by this template"}, {"role": "user", "content": "Hi"}]

        def prompt(**extra) -> str:
            r = post(base, "/tokenize", {"messages": msgs, **extra})
            assert r.status_code == 200, r.text
            return post(base, "/detokenize", {"tokens": r.json()["tokens"]}).json()["prompt"]

        assert prompt() == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        assert (
            prompt(chat_template_kwargs={"enable_thinking": True})
            == "<bos><start_of_turn>user\nHi<end_of_turn>\n[think]\n<start_of_turn>model\n"
        )
        assert prompt(add_generation_prompt=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        counts = []
        for kw in ({}, {"chat_template_kwargs": {"enable_thinking": True}}):
            r = post(base, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, **kw})
            assert r.status_code == 200, r.text
            counts.append(r.json()["usage"]["prompt_tokens"])
        n = len(post(base, "/tokenize", {"messages": msgs}).json()["tokens"])
        assert counts[0] == n and counts[1] > n  # the kwarg reached the template of the request itself
        for body, param in [
            ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
            ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
            ({"continue_final_message": True}, "continue_final_message"),
            ({"add_generation_prompt": 1}, "add_generation_prompt"),
            ({"chat_template": "{{ 1 }}"}, "chat_template"),
        ]:
            r = post(base, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
        assert httpx.get(base + "/health").status_code == 200
    finally:
        stop_server(p)
