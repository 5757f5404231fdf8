"""Structured output of an audited app's calls: the schema as recorded, sent and answered.

LangChain asks for structured output three ways, and an app may use any of them:

- ``json_schema`` (``ChatOpenAI.with_structured_output``'s default in langchain-openai 1.x):
  binds ``response_format=<the pydantic class>`` (or an OpenAI ``json_schema`` dict), which
  the OpenAI SDK sends as ``{"type": "json_schema", "json_schema": {"name", "schema",
  "strict"}}`` and parses back into ``message.parsed``; langchain-openai hands the app that
  object in ``additional_kwargs["parsed"]`` (and the model's refusal in
  ``additional_kwargs["refusal"]``), which its output parser reads;
- ``json_mode``: ``response_format={"type": "json_object"}``, the answer's text parsed by the
  app's parser;
- ``function_calling`` (and LangChain's generic ``BaseChatModel.with_structured_output``): a
  forced tool call, handled like any tool call (`biaslab.agents.tool_answers`).

So that the recorded call and its cache key say exactly what was asked, `response_format_param`
turns the app's ``response_format`` into the form the OpenAI API takes, the SDK's own
conversion included (a pydantic class becomes its strict JSON schema). Each provider then sends
it the way its endpoint accepts (`provider_kwargs`): OpenAI and OpenAI-compatible servers as it
is (llama.cpp's ``llama-server`` honours ``json_schema`` with constrained decoding, and so do
vLLM and Ollama), the embedded model as a ``json_schema`` constraint (llama.cpp turns it into a
grammar), a scripted model reads it from its request (`schema_of`). `openai_answer_fields`
rebuilds what langchain-openai would put on the answer.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from biaslab.errors import ModelCallError

__all__ = ["response_format_param", "schema_of", "provider_kwargs", "openai_answer_fields",
           "is_openai_chat_model", "structured_text"]


def _pydantic_class(value: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return False
    return isinstance(value, type) and issubclass(value, BaseModel)


def _class_param(value: type) -> dict[str, Any]:
    """What the OpenAI SDK sends for a class given as ``response_format``: its own conversion
    (the strict schema OpenAI requires), or, where the SDK lacks it, LangChain's."""
    try:  # the SDK's own converter: exactly what `chat.completions.parse` sends
        from openai.lib._parsing._completions import type_to_response_format_param
        return dict(type_to_response_format_param(value))
    except (ImportError, TypeError, AttributeError):
        from langchain_core.utils.function_calling import convert_to_openai_function

        function = convert_to_openai_function(value, strict=True)
        return {"type": "json_schema",
                "json_schema": {"name": function["name"], "schema": function["parameters"],
                                "strict": True}}


def response_format_param(value: Any) -> dict[str, Any] | None:
    """The app's ``response_format`` as the OpenAI API takes it (JSON only), or None.

    A pydantic class becomes ``{"type": "json_schema", "json_schema": {"name", "schema",
    "strict": true}}`` as the SDK sends it; an OpenAI ``response_format`` dict stays as it is;
    a bare JSON schema (which OpenAI would refuse) is wrapped as a ``json_schema`` named by its
    title, so every endpoint gets one form."""
    if value is None:
        return None
    if isinstance(value, type):
        if _pydantic_class(value) or hasattr(value, "__dataclass_fields__") \
                or hasattr(value, "__annotations__"):
            param = _class_param(value)
        else:
            param = {"type": "json_schema",
                     "json_schema": {"name": value.__name__, "schema": {}, "strict": False}}
    elif isinstance(value, Mapping) and value.get("type") in ("json_schema", "json_object",
                                                                "text"):
        param = dict(value)
    elif isinstance(value, Mapping):
        param = {"type": "json_schema",
                 "json_schema": {"name": str(value.get("title") or "response"),
                                 "schema": dict(value), "strict": False}}
    else:
        raise ModelCallError(f"response_format of type {type(value).__name__} is neither a "
                             "schema class nor a dict", status=400)
    return json.loads(json.dumps(param, sort_keys=True, default=str))


def schema_of(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema a normalised ``response_format`` asks the answer to follow: the
    ``json_schema``'s schema, a ``json_object``'s ``schema`` (llama.cpp's extension) or
    ``{"type": "object"}`` for plain JSON mode; None for text."""
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        inner = response_format.get("json_schema") or {}
        return dict(inner.get("schema") or {"type": "object"})
    if kind == "json_object":
        return dict(response_format.get("schema") or {"type": "object"})
    return None


def provider_kwargs(provider: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's parameters in the form `provider`'s endpoint takes.

    OpenAI and OpenAI-compatible servers (and scripted models) take ``response_format`` as
    recorded. The embedded model takes the schema as its ``json_schema`` option (llama.cpp
    compiles it into a grammar); it calls no tools, so a request that offers tools fails with
    one line instead of being answered as if none were offered."""
    if provider != "local":
        return kwargs
    out = dict(kwargs)
    if out.pop("tools", None):
        raise ModelCallError("the embedded model (local) does not call tools: bind_tools and "
                             "with_structured_output(method=\"function_calling\") need a model "
                             "served over an OpenAI-compatible endpoint", status=400)
    for key in ("tool_choice", "parallel_tool_calls", "strict"):
        out.pop(key, None)
    schema = schema_of(out.pop("response_format", None))
    if schema is not None and "grammar" not in out:
        out["json_schema"] = schema
    return out


def structured_text(value: Any) -> str | None:
    """A scripted answer given as a dict or a pydantic object, as the JSON text a model
    answering the schema would write; None for anything else."""
    if isinstance(value, Mapping):
        return json.dumps(dict(value), ensure_ascii=False, default=str)
    dump = getattr(value, "model_dump_json", None)
    if callable(dump) and not isinstance(value, type):
        return dump()
    return None


def is_openai_chat_model(model: Any) -> bool:
    """Whether `model` is one of langchain-openai's chat models (whose answers to a
    ``response_format`` carry ``parsed`` and ``refusal``)."""
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:
        return False
    return isinstance(model, BaseChatOpenAI)


def openai_answer_fields(model: Any, response_format: Any, content: str,
                         refusal: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``additional_kwargs``, extra ``response_metadata``) of the answer langchain-openai's
    Chat Completions path would give the app for this request.

    With a ``response_format`` it goes through the SDK's ``parse``: ``parsed`` is the class
    validated from the text (a class schema, an answer with text and no refusal; a text that
    does not validate raises as it does there), else None; ``refusal`` is the model's refusal
    or None. Without one, only a refusal is kept. ``model_provider = "openai"`` lets the
    app's parser find a refusal among the message's content blocks. Other chat models get no
    extra fields: their own structured output reads the text or a tool call."""
    if not is_openai_chat_model(model):
        return ({"refusal": refusal} if refusal else {}), {}
    meta = {"model_provider": "openai"}
    if response_format is None:
        return ({"refusal": refusal} if refusal else {}), meta
    parsed = None
    if content and not refusal and isinstance(response_format, type):
        if _pydantic_class(response_format):
            parsed = response_format.model_validate_json(content)
        else:
            from pydantic import TypeAdapter
            parsed = TypeAdapter(response_format).validate_json(content)
    return {"parsed": parsed, "refusal": refusal}, meta
