"""Structured output of an audited app's calls, every method, called as apps call it: what is
recorded (the schema in the form the OpenAI API takes, part of the cache key) and what the app
gets back (what langchain-openai would give it: ``parsed``, refusals as refusals)."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langchain_openai.chat_models.base import OpenAIRefusalError
from pydantic import BaseModel

from biaslab.agents.app_models import AppCalls, intercepting
from biaslab.agents.context import Bindings, CellContext
from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import parse_model
from biaslab.agents.providers.scripted import Reply, Rule, ScriptedChatModel, register_scripted
from biaslab.agents.structured_output import provider_kwargs, response_format_param
from biaslab.errors import ModelCallError
from biaslab.prompts.exposure import CLEAN
from biaslab.prompts.registry import PromptRegistry


class Route(BaseModel):
    """Who works next."""

    next: Literal["screener", "decider"]


class RouteWithReason(BaseModel):
    """Who works next."""

    next: Literal["screener", "decider"]
    reason: str


def _answer(request):
    if "refuse" in request.user:
        return Reply(refusal="I can't route that.")
    return {"next": "decider", "reason": "notes are in"} if request.schema and \
        "reason" in request.schema.get("properties", {}) else Route(next="decider")


register_scripted("structured-methods", lambda: ScriptedChatModel(
    name_="structured-methods", rules=[Rule(r".", _answer)]))


def _run(make, text: str = "Who works next?"):
    """Run `make(llm)` (a runnable) on one message inside an audited cell: (result, records)."""
    llm = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1",
                     max_retries=0)

    async def go():
        ctx = CellContext(cell_id="c", seed=1, bindings=Bindings(
            parse_model("scripted:structured-methods"), {}, {}), gateway=Gateway(),
            prompts=PromptRegistry(), condition=CLEAN)
        with intercepting(AppCalls(ctx, asyncio.get_running_loop())):
            try:
                result = await make(llm).ainvoke([HumanMessage(text)])
            except Exception as exc:  # what the app would meet
                result = exc
        return result, ctx.calls

    return asyncio.run(go())


def test_the_default_json_schema_method_returns_the_parsed_object():
    result, records = _run(lambda llm: llm.with_structured_output(Route, include_raw=True))
    assert result["parsed"] == Route(next="decider") and result["parsing_error"] is None
    raw = result["raw"]
    assert raw.additional_kwargs == {"parsed": Route(next="decider"), "refusal": None}
    assert raw.content == '{"next":"decider"}'
    sent = records[0].params["response_format"]
    assert sent == {"type": "json_schema", "json_schema": {
        "name": "Route", "strict": True, "schema": {
            "type": "object", "title": "Route", "description": "Who works next.",
            "properties": {"next": {"enum": ["screener", "decider"], "title": "Next",
                                    "type": "string"}},
            "required": ["next"], "additionalProperties": False}}}


def test_json_mode_and_function_calling_and_the_generic_path():
    result, records = _run(lambda llm: llm.with_structured_output(Route, method="json_mode"))
    assert result == Route(next="decider")
    assert records[0].params["response_format"] == {"type": "json_object"}

    result, records = _run(lambda llm: llm.with_structured_output(
        Route, method="function_calling"))
    assert result == Route(next="decider")
    assert records[0].params["tool_choice"]["function"]["name"] == "Route"
    assert records[0].parsed["tool_calls"][0]["args"] == {"next": "decider"}

    # LangChain's generic structured output (any chat model with bind_tools): a forced tool
    result, records = _run(lambda llm: BaseChatModel.with_structured_output(llm, Route))
    assert result == Route(next="decider")
    assert records[0].params["tool_choice"] == "required"


def test_a_dict_schema_is_answered_as_a_dict():
    schema = RouteWithReason.model_json_schema()
    result, records = _run(lambda llm: llm.with_structured_output(schema))
    assert result == {"next": "decider", "reason": "notes are in"}
    assert records[0].params["response_format"]["json_schema"]["name"] == "RouteWithReason"


def test_a_refusal_reaches_the_app_as_a_refusal_and_is_recorded():
    result, records = _run(lambda llm: llm.with_structured_output(Route), "Please refuse.")
    assert isinstance(result, OpenAIRefusalError) and "I can't route that." in str(result)
    assert records[0].parsed == {"refusal": "I can't route that."}
    result, _ = _run(lambda llm: llm.with_structured_output(Route, include_raw=True),
                     "Please refuse.")
    assert result["parsed"] is None and isinstance(result["parsing_error"], OpenAIRefusalError)
    assert result["raw"].additional_kwargs == {"parsed": None, "refusal": "I can't route that."}


def test_the_schema_is_part_of_the_cache_key():
    _, a = _run(lambda llm: llm.with_structured_output(Route))
    _, b = _run(lambda llm: llm.with_structured_output(RouteWithReason))
    _, c = _run(lambda llm: llm.with_structured_output(Route))
    assert a[0].messages == b[0].messages
    assert a[0].cache_key != b[0].cache_key and a[0].cache_key == c[0].cache_key


def test_each_provider_gets_the_schema_in_its_own_form():
    form = response_format_param(Route)
    # OpenAI-compatible servers (OpenAI, vLLM, llama.cpp's llama-server) take it as it is
    assert provider_kwargs("openai-compatible", {"response_format": form}) == \
        {"response_format": form}
    # the embedded llama.cpp model: a JSON-schema constraint (compiled into a grammar)
    assert provider_kwargs("local", {"response_format": form, "seed": 1}) == \
        {"json_schema": form["json_schema"]["schema"], "seed": 1}
    assert provider_kwargs("local", {"response_format": {"type": "json_object"}}) == \
        {"json_schema": {"type": "object"}}
    with pytest.raises(ModelCallError, match="does not call tools"):
        provider_kwargs("local", {"tools": [{"type": "function"}], "tool_choice": "required"})
    # a bare JSON schema, which OpenAI would refuse, is sent in the one form every server takes
    assert response_format_param({"title": "R", "type": "object"}) == {
        "type": "json_schema", "json_schema": {"name": "R", "strict": False,
                                               "schema": {"title": "R", "type": "object"}}}


@pytest.mark.local_model
def test_the_embedded_model_answers_the_schema_it_is_sent():
    """One short call to the embedded SmolLM2: the recorded OpenAI form becomes its
    json_schema constraint, so even a 135M model writes a valid ``Route``."""
    from biaslab.errors import ModelCallError as Failed

    async def go():
        gateway = Gateway()
        done = await gateway.complete(
            parse_model("local"), [{"role": "user", "content": "Who works next? As JSON."}],
            {"max_tokens": 30, "seed": 1, "temperature": 0.0,
             "response_format": response_format_param(Route)}, 0)
        with pytest.raises(Failed, match="does not call tools"):
            await gateway.complete(parse_model("local"), [{"role": "user", "content": "x"}],
                                   {"max_tokens": 5, "seed": 1, "tools": [
                                       {"type": "function", "function": {"name": "f"}}]}, 0)
        return done.raw

    assert Route.model_validate_json(asyncio.run(go())).next in ("screener", "decider")
