"""Prompt logprobs over HTTP: lm-eval-harness' loglikelihood request (echo + logprobs, max_tokens
0 or 1), vLLM's prompt_logprobs, text_offset, and the raw bytes of a byte-fallback token."""

from __future__ import annotations

import pytest
import torch

from tailgate.engine.pages import SeqPages
from tailgate.engine.plan import Segment
from tailgate.server.token_bytes import token_bytes
from live import MODEL, post

TEXT = "The capital of France is Paris, and the capital of Italy is Rome."


@pytest.fixture(scope="module")
def scored(server, rig):
    """The prompt's ids (as the server tokenizes them) and the model's log-softmax over it: one
    prefill with every row's logits, the step the server runs for this prompt (it fits one
    64-row walk chunk), on the server's plan (--dtype auto, --kernels auto)."""
    prompt = post(server[0], "/tokenize", {"prompt": TEXT}).json()["tokens"]
    return prompt, log_softmax(rig(MODEL, "auto"), prompt), rig(MODEL, "auto").model.tokenizer


def log_softmax(r, prompt):
    assert len(prompt) < 64
    seq = SeqPages()
    try:
        assert r.book.reserve(seq, len(prompt))
        logits = r.runner.step([Segment(prompt, 0, seq, all_logits=True)])
    finally:
        r.book.free(seq)
    return torch.log_softmax(logits.float(), -1)


def check_prompt_logprobs(pl, prompt, lsm, k):
    assert len(pl) == len(prompt) and pl[0] is None
    for i in range(1, len(prompt)):
        row, t = lsm[i - 1], prompt[i]
        own = pl[i][str(t)]
        assert abs(own["logprob"] - row[t].item()) < 1e-4
        assert own["rank"] == int((row > row[t]).sum()) + 1
        top = sorted(((e["rank"], e["logprob"]) for key, e in pl[i].items() if key != str(t) or e["rank"] <= k))
        assert [round(v, 3) for _, v in top[:k]] == [round(v, 3) for v in row.topk(k).values.tolist()]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_lm_eval_loglikelihood_request_gets_the_prompts_log_softmax(server, scored, max_tokens):
    prompt, lsm, tok = scored
    piece = lambda t: tok.decode([t], skip_special=False)  # noqa: E731
    # lm-eval-harness' local-completions loglikelihood body: token ids, echo, logprobs 1, greedy
    body = {
        "model": MODEL,
        "prompt": prompt,
        "echo": True,
        "logprobs": 1,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1234,
    }
    got = post(server[0], "/v1/completions", body)
    assert got.status_code == 200, got.text
    ch = got.json()["choices"][0]
    block, n = ch["logprobs"], len(prompt)
    assert len(block["tokens"]) == len(block["token_logprobs"]) == n + max_tokens
    assert block["tokens"][:n] == [piece(t) for t in prompt]
    assert block["token_logprobs"][0] is None and block["top_logprobs"][0] is None
    errs = [abs(block["token_logprobs"][i] - lsm[i - 1, prompt[i]].item()) for i in range(1, n)]
    for i in range(1, n):  # logprobs 1: the greedy token's (lm-eval's is_greedy reads it)
        (v,) = block["top_logprobs"][i].values()
        errs.append(abs(v - lsm[i - 1].max().item()))
    # The server ran this very step on this plan: measured equal to the bit on an AMD EPYC (AVX2);
    # the bound leaves room for fp32 summation order only.
    assert max(errs) < 1e-4, max(errs)
    offsets = [sum(len(t) for t in block["tokens"][:i]) for i in range(len(block["tokens"]))]
    assert block["text_offset"] == offsets
    assert ch["text"].startswith(tok.decode(prompt, skip_special=False))
    assert ch["finish_reason"] == "length" or max_tokens == 1
    if max_tokens == 0:
        assert ch["text"] == tok.decode(prompt, skip_special=False) and got.json()["usage"]["completion_tokens"] == 0


def test_vllm_prompt_logprobs_name_each_prompt_token_with_its_rank_and_the_top_k(server, client, scored):
    prompt, lsm, tok = scored
    got = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    check_prompt_logprobs(got.choices[0].model_extra["prompt_logprobs"], prompt, lsm, 2)


def test_chat_prompt_logprobs_sit_beside_the_choices_and_score_the_templated_prompt(server, client, rig):
    messages = [{"role": "user", "content": TEXT}]
    prompt = post(server[0], "/tokenize", {"messages": messages}).json()["tokens"]
    lsm = log_softmax(rig(MODEL, "auto"), prompt)
    got = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, temperature=0, n=2, extra_body={"prompt_logprobs": 3}
    )
    check_prompt_logprobs(got.model_extra["prompt_logprobs"], prompt, lsm, 3)
    assert got.usage.prompt_tokens == len(prompt)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, temperature=0, stream=True, extra_body={"prompt_logprobs": 1}
        )
    )
    carried = [c.model_extra["prompt_logprobs"] for c in chunks if c.model_extra.get("prompt_logprobs")]
    assert len(carried) == 1  # once, on the first chunk after they arrived
    check_prompt_logprobs(carried[0], prompt, lsm, 1)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert "prompt_logprobs" not in (plain.model_extra or {})


def test_a_streamed_echo_with_logprobs_opens_with_the_prompt_and_its_logprobs(server, client, scored):
    prompt, lsm, tok = scored
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=0, stream=True
        )
    )
    first = chunks[0].choices[0]
    assert first.text == tok.decode(prompt, skip_special=False)
    assert len(first.logprobs.tokens) == len(prompt) and first.logprobs.token_logprobs[0] is None
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]  # running across chunks


def test_a_byte_fallback_tokens_bytes_are_its_own_raw_bytes(loaded):
    gemma = loaded("gemma3-270m").tokenizer  # SentencePiece byte fallback: <0xE2> is byte 0xE2
    i = gemma._tok.token_to_id("<0xE2>")
    assert gemma.decode([i], skip_special=False) == "\ufffd" and token_bytes(gemma, i, "\ufffd") == [0xE2]
    smol = loaded("smollm2-135m").tokenizer  # byte-level BPE: an emoji split over two tokens
    ids = smol.encode("a 😀", add_bos=False)
    raw = b"".join(bytes(token_bytes(smol, t, smol.decode([t], skip_special=False))) for t in ids)
    assert raw.decode() == "a 😀" and any("\ufffd" in smol.decode([t]) for t in ids)
