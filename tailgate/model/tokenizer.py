"""Tokenizer + chat template. BOS is added by us, exactly once, as the model's metadata asks.

Chat templates are rendered by HF transformers' own renderer
(`transformers.utils.chat_template_utils.render_jinja_template`: its sandboxed Jinja environment
with `trim_blocks` / `lstrip_blocks`, loop controls, `strftime_now`, its `tojson`,
`raise_exception`, the `{% generation %}` tag), with the variables `apply_chat_template` passes
(the named special tokens, then the request's `chat_template_kwargs`), so a prompt is byte-equal to
`tokenizer.apply_chat_template(..., tokenize=False)` and so to vLLM's. Importing that module costs
~1 s (the `transformers` package, not torch), so it happens when a template is first compiled
(`compile_chat_template`: the server does it at load, off the request path), never at import.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from . import families

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
FALLBACK_TEMPLATES = {"gemma": GEMMA_TEMPLATE, "chatml": CHATML_TEMPLATE}  # by families.Family.chat_fallback

# The named special tokens `apply_chat_template` hands every template (HF's SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Variables the renderer binds itself: a request's chat_template_kwargs cannot set them.
RESERVED_TEMPLATE_VARS = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "chat_template",
        "conversations",
        "tokenize",
        "return_assistant_tokens_mask",
        "add_generation_prompt",
        "continue_final_message",
    }
)


class ChatTemplateError(ValueError):
    """A chat template that does not compile or cannot render this conversation; `param` is the
    request field to blame."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message)
        self.param = param


def load_chat_template(raw: str) -> str:
    """`--chat-template`'s value read as vLLM reads it: a file's text; or, when it is no readable
    file but holds `{`, `}` or a newline, the template itself. A value that looks like a path
    and cannot be read, a file that is not UTF-8 and an empty template are ValueErrors."""
    try:
        with open(raw, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{raw!r} is not UTF-8 text ({e.reason})") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the value
        if not any(c in raw for c in "{}\n"):
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ValueError(f"{raw!r} looks like a file path but cannot be read ({why})") from None
        text = raw
    if not text.strip():
        raise ValueError("the chat template is empty")
    return text


def compile_chat_template(template: str) -> None:
    """Check that `template` compiles in transformers' chat-template environment (its public
    renderer, `render_jinja_template`, compiles and caches by the template's text, so a request's
    rendering reuses it): one render of a one-message conversation, where only a syntax error
    counts (a template may legitimately refuse a conversation it is not given); a
    ChatTemplateError says why it does not compile."""
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        render_jinja_template(
            conversations=[[{"role": "user", "content": "hi"}]], chat_template=template, add_generation_prompt=True
        )
    except jinja2.TemplateSyntaxError as e:  # and TemplateAssertionError: an unknown filter or test
        raise ChatTemplateError(f"the chat template does not compile: {e.message} (line {e.lineno})") from None
    except Exception:  # it compiled; what it says of this conversation is each request's business
        pass


def _default_template(template):
    """A tokenizer_config.json may list named templates ([{"name", "template"}] or a dict); HF
    uses the one named "default"."""
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


class Tokenizer:
    def __init__(self, path: str, meta: dict):
        self._tok = _HFTokenizer.from_file(path)
        self.bos_id = meta.get("bos_id")
        self.eos_ids = list(meta.get("eos_ids") or [])
        self.add_bos = bool(meta.get("add_bos")) and self.bos_id is not None
        # Without a template of its own: the one its family names (families.Family.chat_fallback:
        # Gemma 3's turn format, ChatML for the Llama shapes, none for Gemma 4), ChatML when unknown.
        family = families.FAMILIES.get(meta.get("family") or "")
        # A model without a chat template of its own is, as a rule, a base (pretrained) model: it
        # continues text, and its chat answers are weak (Gemma 3 270M's GGUF is one; issue 44).
        self.own_template = _default_template(meta.get("chat_template")) is not None
        self.chat_template = _default_template(meta.get("chat_template")) or FALLBACK_TEMPLATES.get(
            family.chat_fallback if family is not None else "chatml"
        )
        self._compiled: str | None = None  # the template text last compiled
        self._template_error: str | None = None  # why the model's own template cannot render
        self.special_tokens = self._special_tokens(path, meta)
        self.bos_token = self.special_tokens.get("bos_token", "")
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def _special_tokens(self, path: str, meta: dict) -> dict[str, str]:
        """The named special tokens as HF's tokenizer has them: the loader's `special_tokens`;
        else an HF directory's tokenizer_config.json beside tokenizer.json; else (a GGUF
        conversion) the tokens of the BOS id and of the first EOS id (the file's own)."""
        given = meta.get("special_tokens")
        if isinstance(given, dict):
            return {k: str(v) for k, v in given.items() if k in SPECIAL_TOKEN_NAMES and v is not None}
        cfg = Path(path).with_name("tokenizer_config.json")
        if cfg.is_file():
            tc = json.loads(cfg.read_text(encoding="utf-8"))
            out = {}
            for k in SPECIAL_TOKEN_NAMES:
                v = tc.get(k)
                v = v.get("content") if isinstance(v, dict) else v
                if isinstance(v, str):
                    out[k] = v
            return out
        out = {}
        for k, i in (("bos_token", self.bos_id), ("eos_token", self.eos_ids[0] if self.eos_ids else None)):
            t = self._tok.id_to_token(i) if i is not None else None
            if t is not None:
                out[k] = t
        return out

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

    def set_chat_template(self, template: str) -> None:
        """Serve `template` instead of the model's (`--chat-template`); ChatTemplateError if it
        does not compile."""
        compile_chat_template(template)
        self.chat_template, self._compiled, self._template_error = template, template, None
        self.own_template = True

    def compile_chat_template(self) -> str | None:
        """Compile the template now, once (the server does this at load, so no request pays the
        import); returns why chat cannot be served (no template, or one that does not compile),
        or None. A model's own template that does not compile leaves completions served."""
        if self.chat_template is None:
            return (
                "this model's directory has no chat template (tokenizer_config.json chat_template or "
                "chat_template.jinja); use /v1/completions or --chat-template"
            )
        if self._compiled != self.chat_template:
            try:
                compile_chat_template(self.chat_template)
                self._template_error = None
            except ChatTemplateError as e:
                self._template_error = f"this model's chat template cannot be used ({e}); use --chat-template"
            self._compiled = self.chat_template
        return self._template_error

    def render_chat(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
    ) -> str:
        """The prompt text for `messages`, byte-equal to HF's `apply_chat_template(messages,
        tokenize=False, add_generation_prompt=..., continue_final_message=..., tools=...,
        **template_kwargs)`."""
        why = self.compile_chat_template()
        if why is not None:
            raise ChatTemplateError(why)
        kwargs = dict(template_kwargs or {})
        reserved = sorted(RESERVED_TEMPLATE_VARS & kwargs.keys())
        if reserved:
            raise ChatTemplateError(f"'chat_template_kwargs' cannot set {', '.join(reserved)}", "chat_template_kwargs")
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message"
            )
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            rendered, _ = render_jinja_template(
                conversations=[messages],
                tools=tools,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **{**self.special_tokens, **kwargs},
            )
        except Exception as e:  # raise_exception(), a template bug this conversation hits, an undefined call
            if continue_final_message and "continue_final_message" in str(e):
                raise ChatTemplateError(
                    f"'continue_final_message': {str(e).split(chr(10))[0]}", "continue_final_message"
                ) from e
            raise ChatTemplateError(f"chat template failed: {e}") from e
        return rendered[0]

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        # The template writes <bos> itself when the model wants one; encode() will not add a second.
        return self.encode(self.render_chat(messages, add_generation_prompt), add_bos=self.add_bos)


# transformers' top-level names are lazy (`_LazyModule.__getattr__`), and two threads importing
# through it at once can see a half-made module: a first start's tokenizer conversion (`from
# transformers import AutoTokenizer`, the load thread) beside the server's template-renderer import
# (its own thread) failed with "cannot import name 'AutoTokenizer'" once the conversion got fast
# enough to overlap it (SmolLM2, AMX Xeon). Every import of transformers made while the server
# loads goes through this lock.
TRANSFORMERS_IMPORT = threading.Lock()


def import_template_renderer() -> None:
    """Import transformers' chat-template renderer now (~1 s, beside the weights' load), so
    compiling a template later costs milliseconds; a failure is reported where it matters."""
    try:
        with TRANSFORMERS_IMPORT:
            import transformers.utils.chat_template_utils  # noqa: F401
    except Exception:
        pass


def convert_gguf_tokenizer(gguf_path: str, out_path: str) -> None:
    """One-time conversion of GGUF tokenizer metadata into tokenizer.json (slow, hence cached by the
    caller: 22.6 s of a 28.9 s cold start for Gemma's 262k vocab on the AMX Xeon through gguf's
    memory-mapped reader; the caller runs it inside gguf_reads.plain_gguf_reads, which parses the
    file once over a plain array)."""
    import os

    with TRANSFORMERS_IMPORT:
        from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path) or ".", gguf_file=os.path.basename(gguf_path))
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer")
    backend.save(out_path)
