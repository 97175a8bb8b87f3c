"""Tokenizer + chat template. BOS is added by us, exactly once, as the model's metadata asks."""
from __future__ import annotations

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer

# Gemma GGUF files carry no chat template; this renders Gemma's documented turn format
# (a system message is folded into the first user turn, assistant turns are "model").
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(sys='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.sys = m['content'] + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{% if m['role'] == 'user' %}{{ ns.sys }}{% set ns.sys = '' %}{% endif %}"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# A ChatML fallback for Llama-family files without a template.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Tokenizer:
    def __init__(self, path: str, meta: dict):
        self._tok = _HFTokenizer.from_file(path)
        self.bos_id = meta.get("bos_id")
        self.eos_ids = list(meta.get("eos_ids") or [])
        self.add_bos = bool(meta.get("add_bos")) and self.bos_id is not None
        # Without a template of its own: Gemma 3's turn format, or ChatML for Llama; Gemma 4's format
        # differs from both, so a Gemma 4 directory without a template serves no chat.
        family = meta.get("family")
        template = meta.get("chat_template") or \
            (GEMMA_TEMPLATE if family == "gemma3" else None if family == "gemma4" else CHATML_TEMPLATE)
        env = ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False)
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(template) if template is not None else None
        self.bos_token = self._tok.id_to_token(self.bos_id) if self.bos_id is not None else ""
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:  # exactly once, even if the text spelled it out
                ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ValueError("this model's directory has no chat template (tokenizer_config.json "
                             "chat_template or chat_template.jinja); use /v1/completions")
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token="")
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template failed: {e}") from e

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        # The template writes <bos> itself when the model wants one; encode() will not add a second.
        return self.encode(self.render_chat(messages, add_generation_prompt), add_bos=self.add_bos)


def _raise(msg):
    raise jinja2.TemplateError(msg)


def convert_gguf_tokenizer(gguf_path: str, out_path: str) -> None:
    """One-time conversion of GGUF tokenizer metadata into tokenizer.json (slow: ~20 s for Gemma's
    262k vocab, hence cached by the caller)."""
    import os

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path) or ".", gguf_file=os.path.basename(gguf_path))
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer")
    backend.save(out_path)
