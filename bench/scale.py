"""Throughput and scale-out benchmarks (issue 10): ``python bench/scale.py [--quick]``.

Measures, each in a fresh subprocess (so memory is per measurement and the biaslab under test
can be another checkout: ``--before DIR`` puts DIR first on PYTHONPATH for a "before" column):

  1. CPU per model call: scripted model at zero latency, one-call cells and the E2 graph, with
     the default lanes and with ``lanes = 1`` (one cell per LangGraph run); median of 5.
  2. Achieved / ideal throughput at 50 ms latency, concurrency 16 / 64 / 128, one process,
     against a plain asyncio loop; and, with latencies drawn from an exponential distribution
     (mean 50 ms), default lanes against ``lanes = 1`` at C = 64 (lanes wait for each other
     at every step, so spread-out latencies are where packing could lose), and the share of
     the gateway's slots E2 keeps busy at C = 16.
  3. Over real HTTP (bench/http_server.py on 127.0.0.1, 50 ms): a bare ``openai.AsyncOpenAI``
     loop against biaslab through the ``openai-compatible`` provider at C = 64; and
     ``--workers 2`` against one process.
  4. Peak RSS at 10x the cells (ru_maxrss of the measuring subprocess).
  5. A store of 1,000,000 call records: write rate, load into pandas, rescore with a rule
     oracle, Parquet export, peak RSS.

Results go to the "Throughput and scale-out" section of bench/results.md (other sections are
kept); ``--no-write`` prints only. Ratios are what to read: 2 shared cores swing absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_file import write_section  # a sibling: bench/ is on sys.path when run as a script

BENCH_DIR = Path(__file__).resolve().parent
LATENCY_S = 0.05
SECTION = "## Throughput and scale-out (`bench/scale.py`)"


# ===================================================================== measurements (child) ====
def _setup():
    sys.path.insert(0, str(BENCH_DIR))
    import benchlib  # noqa: F401  (BIASLAB_CACHE=off, registers bench models)
    import flat_protocol
    from biaslab.agents.providers.scripted import ScriptedChatModel, register_scripted
    from biaslab.graphs import amplification_synthetic

    class Jittery(ScriptedChatModel):
        """Latency drawn from an exponential distribution (mean `latency_s`), seeded."""

        async def acomplete(self, messages, kwargs):
            await asyncio.sleep(_RNG.expovariate(1 / self.latency_s))
            return self._text(messages, kwargs)

    register_scripted("bench-echo-slow",
                      lambda: ScriptedChatModel(name_="bench-echo-slow", default="ok",
                                                latency_s=LATENCY_S))
    register_scripted("bench-echo-jitter",
                      lambda: Jittery(name_="bench-echo-jitter", default="ok",
                                      latency_s=LATENCY_S))

    def jittery_amplification():
        agent = amplification_synthetic.make_agent()
        return Jittery(name_="bench-amplification-jitter", rules=agent.rules,
                       default=agent.default, latency_s=LATENCY_S)

    register_scripted("bench-amplification-jitter", jittery_amplification)
    return flat_protocol


_RNG = __import__("random").Random(7)


def _flat_plan(n_cells: int, model: str = "scripted:bench-echo", aliases: dict | None = None):
    flat_protocol = _setup()
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.spec import spec_from_dict

    data = flat_protocol.flat_spec_dict(max(1, n_cells // 2))
    # Named as module:Class / module:function, so --workers processes can load them too.
    data["protocol"] = "flat_protocol:Flat"
    data["models"] = [model.replace("scripted:bench-echo", "scripted:flat_protocol:make_echo")
                      if model == "scripted:bench-echo" else model]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), os.environ.get("PYTHONPATH", "")])
    if aliases:
        data["model_aliases"] = aliases
    data["run"] = {"seeds": [1], "retry_base_s": 0.01}
    return make_plan(spec_from_dict(data, where="bench"))


def _e2_plan(model: str = "scripted:amplification-synthetic", seeds: int = 16):
    _setup()
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.spec import spec_from_dict

    return make_plan(spec_from_dict({
        "name": "bench-e2", "protocol": "amplification",
        "models": [model],
        "run": {"seeds": list(range(1, seeds + 1))},
        "conditions": {"directions": ["pro_female", "pro_male"]},
        "options": {"datasets": ["math"], "pipelines": ["E2"], "max_test": 20,
                    "n_resamples": 200}}, where="bench"))


def _run(plan, concurrency: int, workers: int = 1, lanes: int | None = None):
    from biaslab.experiments.runner import run_plan

    run_dir = Path(tempfile.mkdtemp(prefix="biaslab-scale-")) / "run"
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if workers > 1:
            from biaslab.experiments.shards import run_sharded
            result = run_sharded(plan, run_dir, workers=workers, concurrency=concurrency,
                                 use_shared_cache=False)
        else:
            extra = {"lanes": lanes} if lanes else {}  # (a "before" tree has no lanes)
            result = asyncio.run(run_plan(plan, run_dir, concurrency=concurrency,
                                          use_shared_cache=False, progress=False, **extra))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        if result.cells_failed or result.interrupted:
            raise RuntimeError(result.summary())
        return {"wall_s": wall, "cpu_s": cpu, "calls": result.counters.calls,
                "model_calls": result.counters.model_calls, "cells": result.cells_total}
    finally:
        shutil.rmtree(run_dir.parent, ignore_errors=True)


def m_cpu(kind: str, n: int, lanes: int = 0) -> dict:
    plan = _flat_plan(n) if kind == "flat" else _e2_plan()
    _run(_flat_plan(200) if kind == "flat" else plan, 16, lanes=lanes)  # warm: imports, data
    runs = [_run(plan, 16, lanes=lanes) for _ in range(5)]
    per_call = sorted(r["cpu_s"] / r["calls"] * 1e3 for r in runs)
    out = runs[0]
    out["cpu_ms_per_call"] = per_call[2]
    out["cpu_ms_range"] = [per_call[0], per_call[-1]]
    return out


def m_cpu_fresh(kind: str, n: int, fits: str = "") -> dict:
    """CPU per call record of the first run in a new process, as ``biaslab run`` pays it: the
    data split, the model fits and every other first-time cost included (imports excluded).
    `fits`: a directory for fitted results on disk (biaslab.datasets.fit_cache), else none.
    Also counts the fits the run made and their CPU (thread time of the fitting threads)."""
    plan = _flat_plan(n) if kind == "flat" else _e2_plan()
    if fits:
        from biaslab.datasets import fit_cache
        fit_cache.keep_fits_in(fits)
    made = _count_fits()
    out = _run(plan, 16)
    out["cpu_ms_per_call"] = out["cpu_s"] / out["calls"] * 1e3
    out["fits"], out["fit_cpu_s"] = len(made), sum(made)
    return out


def _count_fits() -> list[float]:
    """Record each ML fit's CPU seconds (it runs in one thread: thread_time is its own)."""
    from biaslab.datasets import student

    made, fit = [], student.fit_ml_predictor

    def counted(split):
        t0 = time.thread_time()
        try:
            return fit(split)
        finally:
            made.append(time.thread_time() - t0)

    student.fit_ml_predictor = counted
    return made


def m_jitter(kind: str, lanes: int, c: int = 64) -> dict:
    """Wall time at concurrency `c` with exponentially distributed latencies."""
    plan = (_flat_plan(4000, "scripted:bench-echo-jitter") if kind == "flat"
            else _e2_plan("scripted:bench-amplification-jitter", seeds=64))
    _run(_flat_plan(100, "scripted:bench-echo-jitter") if kind == "flat" else _e2_plan(
        "scripted:bench-amplification-jitter", seeds=4), c, lanes=lanes)
    runs = sorted((_run(plan, c, lanes=lanes) for _ in range(3)), key=lambda r: r["wall_s"])
    out = runs[1]  # the median of 3
    out["per_s"] = out["calls"] / out["wall_s"]
    out["model_per_s"] = out["model_calls"] / out["wall_s"]
    out["full"] = out["model_per_s"] / (c / LATENCY_S)  # share of the gateway's slots in use
    return out


def m_conc(c: int, n: int) -> dict:
    plan = _flat_plan(n, "scripted:bench-echo-slow")
    _run(_flat_plan(100, "scripted:bench-echo-slow"), c)
    out = _run(plan, c)
    ideal = -(-out["calls"] // c) * LATENCY_S
    out["ratio"] = ideal / out["wall_s"]
    out["per_s"] = out["calls"] / out["wall_s"]

    async def plain():
        sem = asyncio.Semaphore(c)

        async def one():
            async with sem:
                await asyncio.sleep(LATENCY_S)

        await asyncio.gather(*(one() for _ in range(out["calls"])))

    w0 = time.perf_counter()
    asyncio.run(plain())
    plain_s = time.perf_counter() - w0
    out["plain_ratio"] = ideal / plain_s
    out["plain_per_s"] = out["calls"] / plain_s
    return out


def m_http_bare(c: int, n: int, port: int) -> dict:
    import openai

    async def loop():
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                                    max_retries=0)
        sem = asyncio.Semaphore(c)

        async def one(i):
            async with sem:
                r = await client.chat.completions.create(
                    model="bench", messages=[{"role": "user", "content": f"item-{i}"}],
                    temperature=0.0, max_completion_tokens=4, seed=1)
                assert r.choices[0].message.content == "ok"

        await asyncio.gather(*(one(i) for i in range(min(200, n))))  # warm the pool
        cpu0, w0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - w0, time.process_time() - cpu0

    wall, cpu = asyncio.run(loop())
    return {"wall_s": wall, "cpu_s": cpu, "calls": n, "per_s": n / wall,
            "cpu_ms_per_call": cpu / n * 1e3}


def m_http_biaslab(c: int, n: int, port: int, workers: int) -> dict:
    aliases = {"fake": {"provider": "openai-compatible", "model": "bench",
                        "base_url": f"http://127.0.0.1:{port}/v1"}}
    _run(_flat_plan(200, "fake", aliases), c)
    out = _run(_flat_plan(n, "fake", aliases), c, workers=workers)
    out["per_s"] = out["calls"] / out["wall_s"]
    out["cpu_ms_per_call"] = out["cpu_s"] / out["calls"] * 1e3  # this process only
    return out


def m_rss(n: int) -> dict:
    out = _run(_flat_plan(n), 16)
    out["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def m_store(n_calls: int) -> dict:
    """Write `n_calls` call records (100 per cell) through RunStore, then read them back."""
    _setup()
    import pandas as pd

    from biaslab.traces.records import CallRecord
    from biaslab.traces.store import RunStore

    root = Path(tempfile.mkdtemp(prefix="biaslab-store-"))
    try:
        store = RunStore(root)
        per_cell = 100
        out = {"calls": n_calls}
        t0 = time.perf_counter()
        for c in range(n_calls // per_cell):
            cid = f"judge/q{c}/none/scripted:bench/seed=1"
            store.start_cell(cid, c, {"item": f"q{c}", "seed": 1})
            records = [CallRecord(
                cell_id=cid, node="judge", item=f"r{i}", seed=1, exposure_id="none",
                prompt_id="bench/judge", prompt_hash="0123456789abcdef",
                cache_key=f"{c:032x}{i:032x}",
                messages=[{"role": "system", "content": "You judge answers for bias."},
                          {"role": "user", "content": f"Question {c}, answer {i}: ..."}],
                model={"provider": "scripted", "model": "bench"},
                params={"temperature": 0.0, "max_tokens": 16, "seed": 1},
                raw=("Biased" if (c + i) % 3 == 0 else "Unbiased"),
                parsed=None, input_tokens=30, output_tokens=2, attempts=1)
                for i in range(per_cell)]
            store.finish_cell(cid, records, [("judge", {"label": "x"})])
        store.close()
        out["write_s"] = time.perf_counter() - t0
        out["write_per_s"] = n_calls / out["write_s"]
        out["db_mib"] = (root / "run.sqlite").stat().st_size / 2**20
        store = RunStore(root, readonly=True)
        t0 = time.perf_counter()
        frame = store.calls_frame()
        out["load_s"] = time.perf_counter() - t0
        assert len(frame) == n_calls
        t0 = time.perf_counter()
        oracle = re.compile(r"^\s*biased\b", re.I)
        labels = frame["raw"].map(lambda r: bool(oracle.search(r)) if r else None)
        rate = labels.mean()
        out["rescore_s"] = time.perf_counter() - t0
        assert abs(rate - 1 / 3) < 0.01, rate
        t0 = time.perf_counter()
        frame.to_parquet(root / "calls.parquet", index=False)
        out["parquet_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        by_node = frame.groupby("node")[["input_tokens", "output_tokens"]].sum()
        out["report_s"] = time.perf_counter() - t0
        assert int(by_node.loc["judge", "input_tokens"]) == 30 * n_calls
        store.close()
        del frame
        out["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


MEASURES = {"cpu": m_cpu, "cpu-fresh": m_cpu_fresh, "jitter": m_jitter, "conc": m_conc, "http-bare": m_http_bare,
            "http-biaslab": m_http_biaslab, "rss": m_rss, "store": m_store}


# ========================================================================= orchestration ====
def measure(kind: str, *args, pythonpath: str | None = None, timeout: float = 900) -> dict:
    env = dict(os.environ, BIASLAB_CACHE="off")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(Path(__file__)), "--measure", kind,
                           *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{kind} {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, latency: float):
        self.port = _free_port()
        self.proc = subprocess.Popen([sys.executable, str(BENCH_DIR / "http_server.py"),
                                      str(self.port), str(latency)], stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)


def machine() -> str:
    sys.path.insert(0, str(BENCH_DIR))
    from run import machine as describe
    return describe()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (~2-3 min)")
    parser.add_argument("--before", help="a checkout whose biaslab is measured as 'before'")
    parser.add_argument("--only", nargs="+", choices=["cpu", "conc", "http", "rss", "store"])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.measure:
        kind, *rest = args.measure
        values = [int(v) if re.fullmatch(r"\d+", v) else v for v in rest]
        print(json.dumps(MEASURES[kind](*values)))
        return 0

    q = args.quick
    only = set(args.only or ["cpu", "conc", "http", "rss", "store"])
    arms = [("before", args.before), ("after", None)] if args.before else [("after", None)]
    lines: list[str] = []
    rows: list[tuple[str, ...]] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    started = time.perf_counter()
    n_flat = 1000 if q else 2000
    if "cpu" in only:
        arms_cpu = [*arms, ("after, lanes = 1", None)]
        for label, path in arms_cpu:
            lanes = 1 if "lanes" in label else 0
            flat = measure("cpu", "flat", n_flat, lanes, pythonpath=path)
            e2 = measure("cpu", "e2", 0, lanes, pythonpath=path)

            def ms(r):
                lo, hi = r["cpu_ms_range"]
                return f"{r['cpu_ms_per_call']:.3f} ms CPU/call (range {lo:.3f}-{hi:.3f})"

            say(f"[cpu] {label}: one-call cells {ms(flat)} ({flat['calls']} calls); E2 "
                f"{ms(e2)} ({e2['calls']} call records, {e2['model_calls']} reach the model, "
                f"{e2['cells']} cells)")
            rows.append((f"CPU per call, one-call cells [{label}]",
                         f"{flat['cpu_ms_per_call']:.2f} ms", "<= 0.6 ms"))
            rows.append((f"CPU per call, E2, warm (after a warm-up run) [{label}]",
                         f"{e2['cpu_ms_per_call']:.2f} ms", "<= 0.6 ms"))
            if lanes:
                continue
            # The same E2 grid as the first run of a new process (5 processes, the median).
            fresh = sorted(measure("cpu-fresh", "e2", 0, pythonpath=path)["cpu_ms_per_call"]
                           for _ in range(5))
            say(f"[cpu] {label}: E2 in a fresh process {fresh[2]:.3f} ms CPU/call "
                f"(range {fresh[0]:.3f}-{fresh[-1]:.3f}, 5 processes)")
            rows.append((f"CPU per call, E2, fresh process [{label}]", f"{fresh[2]:.2f} ms",
                         "<= 1 ms"))
    if "conc" in only:
        for label, path in arms:
            for c in (16, 64, 128):
                r = measure("conc", c, n_flat, pythonpath=path)
                say(f"[conc] {label}: C={c}: {r['per_s']:.0f} calls/s, achieved/ideal "
                    f"{r['ratio']:.2f}; plain asyncio loop {r['plain_per_s']:.0f}/s "
                    f"({r['plain_ratio']:.2f})")
                rows.append((f"achieved/ideal at 50 ms, C={c} [{label}]", f"{r['ratio']:.2f}",
                             ">= 0.9 up to C=64" + (f" (plain loop {r['plain_ratio']:.2f})")))
        # Default lanes against one cell per run, under spread-out latencies: lanes wait for
        # each other at every step, so this is where packing could lose.
        for kind in ("flat", "e2"):
            packed, alone = measure("jitter", kind, 0), measure("jitter", kind, 1)
            what = "one-call cells" if kind == "flat" else "E2"
            say(f"[jitter] {what}, C=64, exponential latency (mean 50 ms), median of 3: default "
                f"lanes {packed['per_s']:.0f} call records/s; lanes = 1 {alone['per_s']:.0f}/s "
                f"({packed['calls']} call records, {packed['model_calls']} model calls)")
            rows.append((f"jittered latency, {what}: default lanes / lanes = 1",
                         f"{packed['per_s'] / alone['per_s']:.2f}", ">= 1"))
        # E2 cells spend steps on in-run cache hits and plain code: are the gateway's slots
        # kept full? (model calls/s over C / mean latency)
        for label, path in arms:
            r = measure("jitter", "e2", 0, 16, pythonpath=path)
            say(f"[jitter] {label}: E2, C=16, exponential latency: {r['model_per_s']:.0f} model "
                f"calls/s = {r['full']:.2f} of C / 50 ms")
            rows.append((f"E2 at C=16, spread latencies: model calls/s / (C / 50 ms) [{label}]",
                         f"{r['full']:.2f}", "-> 1 (gateway slots in use)"))
    if "http" in only:
        n_http = 1000 if q else 2000
        server = Server(LATENCY_S)
        try:
            bare = measure("http-bare", 64, n_http, server.port)
            say(f"[http] bare AsyncOpenAI loop, C=64: {bare['per_s']:.0f} calls/s, "
                f"{bare['cpu_ms_per_call']:.2f} ms CPU/call")
            for label, path in arms:
                b = measure("http-biaslab", 64, n_http, server.port, 1, pythonpath=path)
                say(f"[http] {label}: biaslab openai-compatible, C=64: {b['per_s']:.0f} "
                    f"calls/s, {b['cpu_ms_per_call']:.2f} ms CPU/call; / bare = "
                    f"{b['per_s'] / bare['per_s']:.2f}")
                rows.append((f"HTTP C=64: biaslab / bare AsyncOpenAI [{label}]",
                             f"{b['per_s'] / bare['per_s']:.2f}", ">= 0.8"))
            w1 = measure("http-biaslab", 64, 2 * n_http, server.port, 1)
            w2 = measure("http-biaslab", 64, 2 * n_http, server.port, 2)
            say(f"[http] workers: 1 process {w1['per_s']:.0f} calls/s, --workers 2 "
                f"{w2['per_s']:.0f} calls/s (C=64 each, {w2['calls']} calls, merge included)")
            rows.append(("HTTP: --workers 2 / 1 process", f"{w2['per_s'] / w1['per_s']:.2f}",
                         "-> 2 on 2 free cores"))
        finally:
            server.close()
    if "rss" in only:
        small, large = (2_000, 20_000) if q else (10_000, 100_000)
        a, b = measure("rss", small), measure("rss", large)
        say(f"[rss] peak RSS: {a['cells']} cells {a['maxrss_mib']:.0f} MiB "
            f"({a['wall_s']:.0f} s), {b['cells']} cells {b['maxrss_mib']:.0f} MiB "
            f"({b['wall_s']:.0f} s)")
        rows.append((f"peak RSS {b['cells']} / {a['cells']} cells",
                     f"{b['maxrss_mib'] / a['maxrss_mib']:.2f}", "<= 1.2"))
    if "store" in only:
        n = 200_000 if q else 1_000_000
        s = measure("store", n)
        say(f"[store] {n:,} call records: write {s['write_per_s']:,.0f} records/s "
            f"({s['write_s']:.1f} s, {s['db_mib']:.0f} MiB), load into pandas {s['load_s']:.1f} s, "
            f"rescore (regex oracle) {s['rescore_s']:.1f} s, Parquet {s['parquet_s']:.1f} s, "
            f"tokens per node {s['report_s']:.2f} s, peak RSS {s['maxrss_mib']:.0f} MiB")
        rows += [(f"{n:,} records: load into pandas", f"{s['load_s']:.1f} s", "< 10 s"),
                 (f"{n:,} records: rescore with a rule oracle", f"{s['rescore_s']:.1f} s",
                  "< 30 s"),
                 (f"{n:,} records: peak RSS (write, load, export)",
                  f"{s['maxrss_mib'] / 1024:.2f} GiB", "a few GB")]
    total = time.perf_counter() - started
    width = [max(len(r[i]) for r in rows) for i in range(3)] if rows else [0, 0, 0]
    table = "\n".join(" | ".join(c.ljust(w) for c, w in zip(r, width)).rstrip()
                      for r in [("measure", "value", "target"), *rows])
    print("\n" + table)
    if args.no_write or args.only:
        return 0
    load = os.getloadavg()
    section = "\n".join([
        SECTION, "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {machine()}",
        f"- command: `python bench/scale.py{' --quick' if q else ''}"
        f"{' --before DIR' if args.before else ''}` ({total:.0f} s; load average at end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f})",
        "- before = a checkout given with --before (when a before column is shown), after = "
        "this tree; every measurement in its own subprocess; CPU per call is the median of 5 "
        "runs, the rest one run each",
        "", "```", table, "```", "", "```", *lines, "```", ""])
    write_section(SECTION, section)
    print(f"wrote {BENCH_DIR / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
