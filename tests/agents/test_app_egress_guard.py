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
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.errors import UserError
from biaslab.prompts.exposure import CLEAN
from biaslab.prompts.registry import PromptRegistry
from support_http import FakeOpenAI, loopback_only

register_scripted("egress-echo", lambda: ScriptedChatModel(name_="egress-echo",
                                                           rules=[Rule(r".", lambda r: "ok")]))


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
