"""What /openapi.json says beyond the pydantic models (schema.py), as JSON Schema added to them:
the fields that shape an answer, which the server reads from the raw body (structured.py,
tools.py): `logit_bias`, `response_format`, vLLM's `structured_outputs` and `guided_*`, chat's
`tools` / `tool_choice` (and the legacy `functions` / `function_call`); and the rules across
fields (one shape per answer; tool_choice needs tools; continue_final_message needs
add_generation_prompt false). tests/test_openapi_truth.py and schemathesis hold them to the server.

Where JSON Schema cannot say what the server enforces, the declared part is the largest one that
is still sound (a body it admits is served), and the field's description says the rest:
- a grammar (`guided_grammar`, `structured_outputs.grammar`): no schema says which strings parse
  as Lark or GBNF, so only null is declared;
- a named `tool_choice` must name one of the request's own tools: only none / auto / required are
  declared;
- a JSON schema given as JSON text (vLLM's `guided_json`, `structured_outputs.json`): only the
  object (or `true`) is declared;
- the legacy `functions` / `function_call`: only null is declared.
One gap is the other way: any object is declared where a JSON schema goes, and the server refuses
one that uses a keyword llguidance cannot enforce (a 400 naming it); no schema lists those.
"""

from __future__ import annotations

import copy

from ..model.tokenizer import RESERVED_TEMPLATE_VARS

NULL = {"type": "null"}
OFF = {"enum": [None, False]}  # structured_outputs' "not asked"
JSON_SCHEMA = {
    "anyOf": [{"type": "object"}, {"const": True}],
    "description": "a JSON schema: an object, or true for any JSON value (as JSON text too, not declared)",
}
REGEX = {
    "type": "string",
    "minLength": 1,
    "format": "regex",
    "description": "the whole answer matches it (llguidance's regex syntax: Rust's regex crate)",
}
# app.py bounds each choice by the characters the served vocabulary can write (structured.unwritable)
CHOICE = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "string", "x-tailgate-writable": True},
    "description": "the answer is one of these",
}
GRAMMAR = {
    "type": "null",
    "description": "a Lark grammar (llguidance's dialect) or llama.cpp's GBNF; JSON Schema "
    "cannot say which strings parse, so only null is declared (a grammar that does not is a 400)",
}
SO_KINDS = ("json", "regex", "choice", "grammar", "json_object")
SO_DECLARED = {"json": JSON_SCHEMA, "regex": REGEX, "choice": CHOICE, "json_object": {"type": "boolean"}}


def nullable(s: dict) -> dict:
    return {"anyOf": [s, NULL]}


_RF_KINDS = [
    {"type": "object", "required": ["type"], "properties": {"type": {"const": "text"}}},
    {"type": "object", "required": ["type"], "properties": {"type": {"const": "json_object"}}},
    {
        "type": "object",
        "required": ["type", "json_schema"],
        "properties": {
            "type": {"const": "json_schema"},
            "json_schema": {
                "type": "object",
                "required": ["schema"],
                "properties": {"name": {"type": "string"}, "schema": JSON_SCHEMA},
            },
        },
    },
]
_SO = {
    "type": "object",
    "properties": {
        **{k: {"anyOf": [s, OFF]} for k, s in SO_DECLARED.items()},
        "grammar": {**OFF, "description": GRAMMAR["description"]},
    },
    # vLLM's other StructuredOutputsParams fields at their defaults; set, they are refused.
    "additionalProperties": {
        "anyOf": [{"enum": [None, False, ""]}, {"type": "array", "maxItems": 0}, {"type": "object", "maxProperties": 0}]
    },
    "anyOf": [{"properties": {k: OFF for k in SO_KINDS if k != free}} for free in SO_KINDS],  # one kind
    "description": "vLLM's: one of json, regex, choice, grammar, json_object",
}
_TOOL = {
    "type": "object",
    "required": ["function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "description": nullable({"type": "string"}),
                "parameters": nullable({"type": "object", "description": "a JSON schema of its arguments"}),
            },
        },
    },
}

COMMON = {
    "logit_bias": nullable(
        {
            "type": "object",
            "maxProperties": 300,
            # app.py bounds the key by the served vocabulary (as token ids elsewhere)
            "propertyNames": {"type": "string", "pattern": "^[0-9]+$", "x-tailgate-token-key": True},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            "description": "token id (a decimal string) to a bias added to its logit",
        }
    ),
    "response_format": nullable({"anyOf": _RF_KINDS}),
    "structured_outputs": nullable(_SO),
    "guided_json": nullable(JSON_SCHEMA),
    "guided_regex": nullable(REGEX),
    "guided_choice": nullable(CHOICE),
    "guided_grammar": GRAMMAR,
}
CHAT = {
    "tools": nullable({"type": "array", "minItems": 1, "items": _TOOL}),
    "tool_choice": {
        "anyOf": [NULL, {"enum": ["none", "auto", "required"]}],
        "description": (
            'or {"type": "function", "function": {"name": ...}} naming one of `tools`: JSON Schema cannot tie a '
            "name to the request's tools, so that form is described, not declared"
        ),
    },
    "parallel_tool_calls": nullable({"type": "boolean"}),
    "functions": {**NULL, "description": "legacy `tools` (a list of functions): described, not declared"},
    "function_call": {**NULL, "description": "legacy `tool_choice` with `functions`: described, not declared"},
}

# The answer takes one shape: two fields that each ask for one (a forced tool call among them) are
# a 400. Each branch leaves one of them free and holds the others at "not asking".
_NOT_ASKING = {
    "response_format": nullable({"type": "object", "properties": {"type": {"const": "text"}}}),
    "structured_outputs": nullable({"type": "object", "properties": {k: OFF for k in SO_KINDS}}),
    "guided_json": NULL,
    "guided_regex": NULL,
    "guided_choice": NULL,
}
_NOT_FORCING = {"tool_choice": {"enum": [None, "none", "auto"]}}


def _one_shape(chat: bool) -> list[dict]:
    held = {**_NOT_ASKING, **(_NOT_FORCING if chat else {})}
    return [{"properties": held}] + [{"properties": {k: v for k, v in held.items() if k != free}} for free in held]


# ---- the chat template's fields (chat and /tokenize; protocol.template_options) -------------
TEMPLATE_FLAGS = ("add_generation_prompt", "continue_final_message")
TEMPLATE_KWARGS = nullable(
    {
        "type": "object",
        "description": "extra variables for the chat template; the two flags here win",
        "properties": {k: {"type": "boolean"} for k in TEMPLATE_FLAGS},
        "propertyNames": {"not": {"enum": sorted(RESERVED_TEMPLATE_VARS - set(TEMPLATE_FLAGS))}},
    }
)


def _flag_off(name: str, top: dict, required: bool) -> dict:
    """The flag is false: at the top (`top`) and in chat_template_kwargs (which wins) when there.
    Sound, not whole: a true at the top that the kwargs turn false is served but not declared
    (one branch per flag keeps the rules few enough for schemathesis' generator to expand them
    all together: with a branch for each place a flag can be set, it gave up on chat's body)."""
    off = {
        "properties": {
            name: top,
            "chat_template_kwargs": nullable({"type": "object", "properties": {name: {"const": False}}}),
        }
    }
    return {**off, "required": [name]} if required else off


TEMPLATE_RULE = {
    "anyOf": [
        _flag_off("continue_final_message", OFF, False),
        _flag_off("add_generation_prompt", {"const": False}, True),
    ]
}


def add(schema: dict, chat: bool) -> None:
    """Declare the fields in a request model's JSON schema (pydantic's json_schema_extra)."""
    schema["properties"].update(copy.deepcopy({**COMMON, **(CHAT if chat else {})}))
    rules = [{"anyOf": _one_shape(chat)}]
    if chat:  # tool_choice other than none needs tools
        rules.append(
            {
                "anyOf": [
                    {"properties": {"tool_choice": {"enum": [None, "none"]}}},
                    {"required": ["tools"], "properties": {"tools": {"type": "array"}}},
                ]
            }
        )
        template(schema, rules)
    schema["allOf"] = copy.deepcopy(rules)


def template(schema: dict, rules: list, only_with: str | None = None) -> None:
    """The template fields' schema and their rule (`only_with`: it binds only when that field is given)."""
    schema["properties"]["chat_template_kwargs"].update(copy.deepcopy(TEMPLATE_KWARGS))
    rules.append(TEMPLATE_RULE if only_with is None else {"anyOf": [{"properties": {only_with: False}}, TEMPLATE_RULE]})


def completion_extra(schema: dict) -> None:
    add(schema, chat=False)


def chat_extra(schema: dict) -> None:
    add(schema, chat=True)


def tokenize_extra(schema: dict) -> None:
    """`prompt` or `messages`; the template's fields bind only with `messages`."""
    schema["anyOf"] = [{"required": ["prompt"]}, {"required": ["messages"]}]
    rules = []
    template(schema, rules, only_with="messages")
    schema["allOf"] = copy.deepcopy(rules)
