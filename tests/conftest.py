"""Shared fixtures: every model (ours and HF's) is loaded once per test session."""

from __future__ import annotations

import os

import pytest
import torch

from tailgate.engine.pages import KVBook, pool_pages
from tailgate.model.check import LONG_TEXT  # noqa: F401  (the tests import it from here)
from tailgate.model.runtime.runner import ModelRunner
from tailgate.model.formats.weights import load_model, resolve_model_path

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

MODELS = ("gemma3-270m", "smollm2-135m")


@pytest.fixture(scope="session")
def loaded():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_model(name, log=lambda m: None)
        return cache[name]

    return get


class Rig:
    """A runner and a page book sized for tests (4 slots, 2048-token context)."""

    def __init__(self, m, dtype, slots=4, max_context=2048, kernels="auto"):
        self.model = m
        self.pages = pool_pages(max_context, slots, m.spec.sliding_window, transient_prompts=slots)
        self.runner = ModelRunner(m.spec, m.weights, self.pages, dtype=dtype, device="cpu", kernels=kernels)
        self.book = KVBook(self.pages["global"], self.pages.get("local"), m.spec.sliding_window)

    def assert_no_leak(self):
        assert self.book.glob.used == 0
        assert self.book.local is None or self.book.local.used == 0


@pytest.fixture(scope="session")
def rig(loaded):
    cache = {}

    def get(name="gemma3-270m", dtype="fp32", kernels="auto"):
        if (name, dtype, kernels) not in cache:
            from harness import shared_weights

            with shared_weights():  # the same prepared weights as the engine gates' (harness.py)
                cache[(name, dtype, kernels)] = Rig(loaded(name), dtype, kernels=kernels)
        return cache[(name, dtype, kernels)]

    return get


@pytest.fixture(scope="session")
def server():
    """One live server for every HTTP gate (tests/live.py): (base URL, /health codes while loading).
    start_server raises, with the server's last log lines, unless /health answered 200."""
    from live import start_server, stop_server

    p, base, seen = start_server()
    yield base, seen
    stop_server(p)  # this very process, by its handle


@pytest.fixture(scope="session")
def smol_server():
    """One live server of the shipped instruct model, SmolLM2-135M-Instruct (chat, structured
    outputs and tools over HTTP; the README's "Call it" block): its base URL."""
    from live import start_server, stop_server

    p, base, _ = start_server(args=["--model", "smollm2-135m"])
    yield base
    stop_server(p)


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


def hf_reads_gguf_once():
    """While open, each GGUF file is parsed once (transformers' loads included), by gguf's own reader
    over a plain array view of its memory map: the product's own `model/formats/gguf_reads.py`, which the
    first start's tokenizer conversion uses too. What HF builds from them is what the oracle gates
    compare with."""
    from tailgate.model.formats.gguf_reads import plain_gguf_reads

    return plain_gguf_reads()


@pytest.fixture(scope="session")
def hf_model():
    cache = {}

    def get(name):
        if name not in cache:
            from transformers import AutoModelForCausalLM

            path = resolve_model_path(name)
            with hf_reads_gguf_once():
                m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            cache[name] = m.eval()
        return cache[name]

    return get
