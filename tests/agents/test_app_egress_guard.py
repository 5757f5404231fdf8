"""The egress guard of an audited app's cell, below the CLI: what a thread the app starts
without the cell's context meets, a sync client inside an async node, the spec's host rules,
and that nothing stays patched after the cell."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import openai
import pytest

from biaslab.agents.app_egress import guarding
from biaslab.agents.app_guard import CellRefused, HostRule, parse_allow_hosts
from biaslab.agents.app_models import AppCalls, intercepting
from biaslab.agents.context import Bindings, CellContext
from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import parse_model
from biaslab.agents.providers.scripted import (Reply, Rule, ScriptedChatModel, ToolCall,
                                               register_scripted)
from biaslab.errors import UserError
from biaslab.prompts.exposure import CLEAN
from biaslab.prompts.registry import PromptRegistry
from support_http import FakeOpenAI, loopback_only



def _answer(request):
    if "lookup" in request.tools and not any(m["role"] == "tool" for m in request.messages):
        return Reply(tool_calls=[ToolCall("lookup", {"applicant": "a1"}, "call-1")])
    return "ok"


register_scripted("egress-echo", lambda: ScriptedChatModel(name_="egress-echo",
                                                           rules=[Rule(r".", _answer)]))
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look up.",
                                           "parameters": {"type": "object", "properties": {
                                               "applicant": {"type": "string"}}}}}


def _calls() -> AppCalls:
    ctx = CellContext(cell_id="c1", seed=1, bindings=Bindings(parse_model("scripted:egress-echo")),
                      gateway=Gateway(), prompts=PromptRegistry(), condition=CLEAN)
    return AppCalls(ctx, asyncio.get_running_loop())


@pytest.fixture
def production(monkeypatch):
    loopback_only(monkeypatch)
    with FakeOpenAI() as server:
        yield server


def test_a_bare_thread_the_app_starts_is_refused_and_sends_nothing(production):
    seen: list[BaseException] = []

    def in_bare_thread():
        try:
            httpx.post(f"{production.base_url}/chat/completions",
                       json={"messages": [{"role": "user", "content": "hi"}]})
        except BaseException as exc:  # what the app's thread meets
            seen.append(exc)

    async def cell():
        calls = _calls()
        with intercepting(calls), guarding(calls):
            thread = threading.Thread(target=in_bare_thread)
            thread.start()
            await asyncio.to_thread(thread.join)

    asyncio.run(cell())
    assert len(seen) == 1 and isinstance(seen[0], httpx.ConnectError)
    assert "bare threading.Thread" in str(seen[0])
    assert production.requests == []


def test_a_sync_client_inside_an_async_node_fails_the_cell(production):
    async def cell():
        calls = _calls()
        with intercepting(calls), guarding(calls):
            client = openai.OpenAI(base_url=production.base_url, api_key="x", max_retries=0)
            with pytest.raises(openai.APIConnectionError):
                client.chat.completions.create(model="m", messages=[
                    {"role": "user", "content": "hi"}])

    with pytest.raises(CellRefused, match="would block the event loop"):
        asyncio.run(cell())
    assert production.requests == []


def test_a_routed_call_is_answered_as_the_sdk_expects_and_nothing_stays_patched(production):
    originals = (socket.socket.connect, httpx.HTTPTransport.handle_request)

    async def cell():
        calls = _calls()
        with intercepting(calls), guarding(calls):
            client = openai.AsyncOpenAI(base_url=production.base_url, api_key="x")
            done = await client.chat.completions.create(model="m", messages=[
                {"role": "user", "content": "hi"}])
            answered = await client.responses.create(model="m", input="hi")
        return done, answered, calls

    done, answered, calls = asyncio.run(cell())
    assert done.choices[0].message.content == "ok" and done.usage.total_tokens > 0
    assert answered.output_text == "ok"
    assert [r.prompt_source for r in calls.ctx.calls] == ["app:openai-sdk"] * 2
    assert (socket.socket.connect, httpx.HTTPTransport.handle_request) == originals
    assert production.requests == []


def test_allow_hosts_reads_hosts_ports_and_ipv6():
    assert parse_allow_hosts(["127.0.0.1:9000", "Records.Example.com", "[::1]:8080"]) == (
        HostRule("127.0.0.1", 9000), HostRule("records.example.com"), HostRule("::1", 8080))
    assert str(HostRule("::1", 8080)) == "[::1]:8080"
    for bad in (["a:b"], ["[::1"], "x", [""]):
        with pytest.raises(UserError):
            parse_allow_hosts(bad)


def test_tool_calls_and_streams_reach_each_client_in_its_own_shape(production):
    def sync_node(base: str):
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        asked = client.chat.completions.create(model="m", tools=[LOOKUP], messages=[
            {"role": "user", "content": "who?"}])
        call = asked.choices[0].message.tool_calls[0]
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(model="m", stream=True, messages=[
                               {"role": "user", "content": "hi"}]) if c.choices)
        flat = {k: LOOKUP["function"][k] for k in ("name", "description", "parameters")}
        responded = client.responses.create(model="m", input="who?",
                                            tools=[{"type": "function", **flat}])
        return call, asked.choices[0].finish_reason, streamed, responded.output[0]

    async def cell():
        calls = _calls()
        with intercepting(calls), guarding(calls):
            found = await asyncio.to_thread(sync_node, production.base_url)
        return found, calls

    (call, finish, streamed, item), calls = asyncio.run(cell())
    assert (call.function.name, call.function.arguments, call.id, finish) == \
        ("lookup", '{"applicant": "a1"}', "call-1", "tool_calls")
    assert streamed == "ok"
    assert (item.type, item.name, item.call_id) == ("function_call", "lookup", "call-1")
    first = calls.ctx.calls[0]
    assert first.params["tools"] == [LOOKUP] and first.parsed["tool_calls"][0]["name"] == "lookup"
    assert calls.ctx.calls[2].params["tools"][0]["function"]["name"] == "lookup"
    assert production.requests == []


def test_clients_below_http_are_refused_at_the_socket_naming_the_host(production):
    import urllib.error
    import urllib.request

    met: list[BaseException] = []

    async def cell():
        calls = _calls()
        with intercepting(calls), guarding(calls):
            try:
                urllib.request.urlopen(f"{production.base_url}/models", timeout=2)
            except urllib.error.URLError as exc:  # what the app's urllib meets
                met.append(exc)
            try:
                await asyncio.open_connection("127.0.0.1", production.port)
            except OSError as exc:  # an asyncio client (aiohttp's way down)
                met.append(exc)

    with pytest.raises(CellRefused) as failed:
        asyncio.run(cell())
    assert f"opened a connection to 127.0.0.1:{production.port}: refused" in str(failed.value)
    assert "(and 1 more)" in str(failed.value)
    assert len(met) == 2 and production.requests == []
