"""biaslab benchmarks: run by hand, ``python bench/run.py`` (about 1–3 minutes).

Every benchmark reports RATIOS of two measurements taken in the same process, each the median
of 3 repeats (`time.perf_counter`), so a noisy machine shifts both sides alike. Absolute times
are printed only as context. See bench/README.md for what each ratio means and its ideal.

    python bench/run.py                     # all five, writes bench/results.md
    python bench/run.py --only cache store  # a subset (results.md is then not written)
    python bench/run.py --no-write          # print only
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import math
import os
import platform
import sqlite3
import sys
import threading
import time
import tracemalloc
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as B  # noqa: E402  (sets BIASLAB_CACHE=off, registers the bench models)
from flat_protocol import PROMPT, make_echo  # noqa: E402

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402

from biaslab.agents.ask import ask  # noqa: E402
from biaslab.agents.gateway import Gateway  # noqa: E402
from biaslab.errors import ReplayMiss  # noqa: E402
from biaslab.experiments.replay import strict_replay  # noqa: E402
from biaslab.graphs.compose import text_answer  # noqa: E402
from biaslab.traces.records import CallRecord  # noqa: E402
from biaslab.traces.store import RunStore  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
_LC = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}


class Report:
    """Rows for the summary table plus free-form detail lines, printed as they come."""

    def __init__(self):
        self.rows: list[tuple[str, str, str, str]] = []
        self.details: list[str] = []

    def row(self, bench: str, metric: str, value: str, ideal: str) -> None:
        self.rows.append((bench, metric, value, ideal))

    def section(self, title: str) -> None:
        self.details.append(title)
        print(title, flush=True)

    def note(self, line: str) -> None:
        self.details.append(line)
        print("  " + line, flush=True)

    def table(self) -> str:
        head = ("benchmark", "ratio / count", "measured", "ideal / expectation")
        rows = [head, *self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        fmt = lambda r: " | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
        return "\n".join([fmt(head), "-+-".join("-" * w for w in widths),
                          *(fmt(r) for r in self.rows)])


# -- 1. concurrency scaling -------------------------------------------------------------------
def bench_concurrency(rep: Report, scratch: B.Scratch) -> None:
    rep.section("[1] concurrency scaling: amplification E0+E1, 50 ms scripted agent, conc 1 vs 8")
    slow = B.amplification_plan(B.SLOW_AGENT)
    fast = B.amplification_plan(B.FAST_AGENT)
    B.timed_run(slow, scratch.new("warm"), concurrency=8)  # imports, prompt cache, graphs
    t1, t8, t0 = [], [], []
    for _ in range(B.REPEATS):  # interleaved, so drifting machine load hits all three alike
        s, r1 = B.timed_run(slow, scratch.new("c1"), concurrency=1)
        t1.append(s)
        s, r8 = B.timed_run(slow, scratch.new("c8"), concurrency=8)
        t8.append(s)
        s, _ = B.timed_run(fast, scratch.new("c1-nolat"), concurrency=1)
        t0.append(s)
    n_model = r1.counters.model_calls
    assert r8.counters.model_calls == n_model, (r1.summary(), r8.summary())
    T1, T8, O = B.median(t1), B.median(t8), B.median(t0)
    speedup = T1 / T8
    depth = 2  # longest chain of dependent calls in a cell: E1 explanation -> prediction
    ideal_model_only = n_model / max(depth, math.ceil(n_model / 8))
    bound = T1 / max(O, depth * B.LATENCY_S)  # the CPU part O runs on one event loop thread
    rep.note(f"cells {r1.cells_run}, call records {r1.counters.calls}, model calls {n_model} "
             f"(the rest are in-run cache hits / in-flight dedup)")
    rep.note(f"T(conc=1) {B.spread(t1)} s; T(conc=8) {B.spread(t8)} s")
    rep.note(f"CPU overhead O = same run with a zero-latency agent at conc=1: {B.spread(t0)} s; "
             f"serial model time n*L = {n_model * B.LATENCY_S:.2f} s")
    rep.note(f"ideal speed-up without CPU overhead = n / max(depth={depth}, ceil(n/8)) = "
             f"{ideal_model_only:.2f}x; with overhead (Amdahl) <= T1/max(O, depth*L) = {bound:.2f}x")
    rep.row("1 concurrency", "T(conc=1) / T(conc=8)", f"{speedup:.2f}x",
            f"<= {ideal_model_only:.1f}x w/o CPU cost; <= {bound:.2f}x given O")
    rep.row("1 concurrency", "speed-up / Amdahl bound", f"{speedup / bound:.2f}",
            "1.0 = all model waiting overlapped")


# -- 2. shared cache ------------------------------------------------------------------------
def bench_cache(rep: Report, scratch: B.Scratch) -> None:
    rep.section("[2] shared cache: same run twice into fresh run dirs, BIASLAB_CACHE=<tmp file>")
    plan = B.amplification_plan(B.SLOW_AGENT)
    first, second, calls2, hits2, own2, calls1 = [], [], [], [], [], []
    try:
        for i in range(B.REPEATS):
            os.environ["BIASLAB_CACHE"] = str(scratch.root / f"shared-cache-{i}.sqlite")
            s, r1 = B.timed_run(plan, scratch.new("cache-a"), concurrency=1, shared_cache=True)
            first.append(s)
            calls1.append(r1.counters.model_calls)
            run2 = scratch.new("cache-b")
            s, r2 = B.timed_run(plan, run2, concurrency=1, shared_cache=True)
            second.append(s)
            calls2.append(r2.counters.model_calls)
            hits2.append(r2.counters.cache_hits)
            store = RunStore(run2, readonly=True)
            own2.append(len(store.cache))
            store.close()
    finally:
        os.environ["BIASLAB_CACHE"] = "off"
    # Is run 2's directory self-contained? A strict replay reads only its run.sqlite.
    try:
        strict_replay(run2, scratch.new("strict"), progress=False)
        replay = "ok"
    except ReplayMiss as exc:
        replay = f"FAILS with ReplayMiss ({str(exc)[:70]}...)"
    ratio = B.median(second) / B.median(first)
    rep.note(f"run 1 {B.spread(first)} s ({calls1[0]} model calls); run 2 {B.spread(second)} s")
    rep.note(f"run 2: model calls {calls2} (must be all 0), cache hits {hits2}")
    rep.note(f"run 2's own run.sqlite cache table holds {own2} entries (run 1's held "
             f"{calls1[0]}): responses served by the shared cache are not copied into the run's "
             "own store")
    rep.note(f"strict replay of run 2's directory (BIASLAB_CACHE=off): {replay}")
    rep.row("2 cache", "T(run 2, all hits) / T(run 1)", f"{ratio:.2f}",
            "-> CPU share of run 1 (about O/T1 of bench 1)")
    rep.row("2 cache", "model calls in run 2", f"{max(calls2)}", "0")


# -- 3. runner overhead per call ---------------------------------------------------------------
def _lc_calls(store: RunStore) -> list[tuple[list, dict]]:
    out = []
    for record in store.iter_calls():
        kwargs = {k: v for k, v in record.params.items() if v is not None}
        out.append(([_LC[m["role"]](content=m["content"]) for m in record.messages], kwargs))
    return out


def _time_bare(model_factory, calls) -> float:
    model = model_factory()

    async def loop():
        for messages, kwargs in calls:
            await model.ainvoke(messages, **kwargs)

    started = time.perf_counter()
    asyncio.run(loop())
    return time.perf_counter() - started


def _time_gateway(plan, records: list[CallRecord]) -> float:
    """gateway.complete for the same messages, no caches: key hashing, semaphore, wait_for."""
    spec = plan.models[0]
    gateway = Gateway(caches=(), concurrency=1)

    async def loop():
        for r in records:
            await gateway.complete(spec, r.messages, r.params, r.sample)

    started = time.perf_counter()
    asyncio.run(loop())
    return time.perf_counter() - started


def _time_ask(plan) -> float:
    """`ask` for every cell (render, exposures, CallRecord) without LangGraph and the store."""
    gateway = Gateway(caches=(), concurrency=1)
    cells = list(plan.cells())

    async def loop():
        for cell in cells:
            ctx = plan.context(cell, gateway)
            await ask(ctx, "answer", {"item": cell.item}, prompt=PROMPT, parser=text_answer,
                      max_tokens=4)

    started = time.perf_counter()
    asyncio.run(loop())
    return time.perf_counter() - started


def _time_graph(plan) -> float:
    """The compiled LangGraph graph per cell (astream, as the runner does), without the store."""
    gateway = Gateway(caches=(), concurrency=1)
    graphs = {v: plan.compile(v) for v in plan.protocol.variants(plan.options)}
    cells = list(plan.cells())

    async def loop():
        for cell in cells:
            ctx = plan.context(cell, gateway)
            state = plan.protocol.initial_state(cell.variant, cell.item, cell.seed, plan.options)
            async for _ in graphs[cell.variant].astream(state, context=ctx, stream_mode="updates"):
                pass

    started = time.perf_counter()
    asyncio.run(loop())
    return time.perf_counter() - started


def _timed_runs(plan, scratch: B.Scratch, label: str):
    """REPEATS whole runs at concurrency 1: their times, and the first run's trace (call
    records and LangChain messages) to replay against the bare model."""
    times, records, calls, result = [], None, None, None
    for _ in range(B.REPEATS):
        run_dir = scratch.new(label)
        seconds, result = B.timed_run(plan, run_dir, concurrency=1)
        times.append(seconds)
        if calls is None:
            store = RunStore(run_dir, readonly=True)
            records = list(store.iter_calls())
            calls = _lc_calls(store)
            store.close()
    return times, records, calls, result


def bench_overhead(rep: Report, scratch: B.Scratch) -> None:
    rep.section("[3] runner overhead per call: zero-latency scripted models, conc=1")
    # (a) one-node protocol: isolates gateway + ask + LangGraph + store
    plan = B.flat_plan(150)  # 300 cells, one call each
    B.timed_run(plan, scratch.new("warm"), concurrency=1)
    full, records, calls, _ = _timed_runs(plan, scratch, "flat")
    bare, gw, ak, gr = [], [], [], []
    for _ in range(B.REPEATS):
        bare.append(_time_bare(make_echo, calls))
        gw.append(_time_gateway(plan, records))
        ak.append(_time_ask(plan))
        gr.append(_time_graph(plan))
    n = len(calls)
    per = {k: B.median(v) / n * 1e6 for k, v in
           (("bare", bare), ("gateway", gw), ("ask", ak), ("graph", gr), ("full", full))}
    rep.note(f"one-node protocol, {n} calls (1 per cell), per call (cumulative layers): "
             f"bare ainvoke {per['bare']:.0f} us | + gateway {per['gateway']:.0f} us | "
             f"+ ask {per['ask']:.0f} us | + LangGraph astream {per['graph']:.0f} us | "
             f"whole runner {per['full']:.0f} us")
    rep.note(f"  increments: gateway {per['gateway'] - per['bare']:+.0f} us, ask (render, "
             f"exposure, CallRecord) {per['ask'] - per['gateway']:+.0f} us, LangGraph "
             f"{per['graph'] - per['ask']:+.0f} us, store + workers + cache writes "
             f"{per['full'] - per['graph']:+.0f} us (differences under ~50 us are noise)")
    rep.note(f"  whole runner: {1e6 / per['full']:.0f} calls/s vs bare loop "
             f"{1e6 / per['bare']:.0f} calls/s")
    rep.row("3 overhead", "one-node protocol: runner / bare ainvoke", f"{per['full'] / per['bare']:.1f}x",
            "small vs a real model call (>= 100 ms)")
    # (b) the amplification grid
    amp = B.amplification_plan(B.FAST_AGENT)
    full_a, _, calls_a, result = _timed_runs(amp, scratch, "amp")
    bare_a = [_time_bare(B.synthetic.make_agent, calls_a) for _ in range(B.REPEATS)]
    na = len(calls_a)
    pa_full, pa_bare = B.median(full_a) / na * 1e3, B.median(bare_a) / na * 1e3
    rep.note(f"amplification grid, {na} call records ({result.counters.model_calls} reach the "
             f"model): per call runner {pa_full:.2f} ms vs bare {pa_bare:.3f} ms "
             f"({na / B.median(full_a):.0f} vs {na / B.median(bare_a):.0f} calls/s)")
    rep.row("3 overhead", "amplification: runner / bare ainvoke", f"{pa_full / pa_bare:.0f}x",
            "dominated by the protocol's own pandas work")


# -- 4. memory flatness ---------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_traced(plan, run_dir) -> int:
    gc.collect()
    tracemalloc.start()
    B.timed_run(plan, run_dir, concurrency=4)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def _peak_rss(plan, run_dir) -> int:
    gc.collect()
    base = _rss_bytes()
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.005):
            peak[0] = max(peak[0], _rss_bytes())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    B.timed_run(plan, run_dir, concurrency=4)
    stop.set()
    thread.join()
    peak[0] = max(peak[0], _rss_bytes())
    return peak[0] - base


def _item_axis_peak(plan) -> int:
    """Peak traced memory of just iterating plan.cells() (what the grid definition costs)."""
    gc.collect()
    tracemalloc.start()
    for _ in plan.cells():
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def bench_memory(rep: Report, scratch: B.Scratch) -> None:
    n_items = 100  # x2 conditions = 200 cells; 4N = 800 cells
    rep.section(f"[4] memory flatness: one-node protocol, {2 * n_items} vs {8 * n_items} cells, "
                "conc=4")
    small, large = B.flat_plan(n_items), B.flat_plan(4 * n_items)
    B.timed_run(B.flat_plan(50), scratch.new("warm"), concurrency=4)
    tm_s, tm_l, gc_s, gc_l, rss_s, rss_l = [], [], [], [], [], []
    for _ in range(B.REPEATS):
        tm_s.append(_peak_traced(small, scratch.new("mem-s")))
        tm_l.append(_peak_traced(large, scratch.new("mem-l")))
    thresholds = gc.get_threshold()
    gc.set_threshold(50, 5, 5)  # collect cyclic garbage promptly: what remains is really held
    try:
        for _ in range(B.REPEATS):
            gc_s.append(_peak_traced(small, scratch.new("gc-s")))
            gc_l.append(_peak_traced(large, scratch.new("gc-l")))
    finally:
        gc.set_threshold(*thresholds)
    for _ in range(B.REPEATS):
        rss_s.append(_peak_rss(small, scratch.new("rss-s")))
        rss_l.append(_peak_rss(large, scratch.new("rss-l")))
    axis_s, axis_l = _item_axis_peak(small), _item_axis_peak(large)
    ps, pl = B.median(tm_s), B.median(tm_l)
    gs, gl = B.median(gc_s), B.median(gc_l)
    cells_s, cells_l = small.n_cells(), large.n_cells()
    extra = cells_l - cells_s
    rep.note(f"tracemalloc peak during run_plan: {cells_s} cells {ps / 1024:.0f} KiB, "
             f"{cells_l} cells {pl / 1024:.0f} KiB -> {(pl - ps) / extra:.0f} B per extra cell")
    rep.note(f"same with gc threshold (50, 5, 5): {gs / 1024:.0f} -> {gl / 1024:.0f} KiB -> "
             f"{(gl - gs) / extra:.0f} B per extra cell (the rest above was cyclic garbage "
             "waiting for the collector, not held memory)")
    rep.note(f"iterating plan.cells() alone (Protocol.items() list + itertools.product's copy "
             f"of it): {axis_s / 1024:.0f} -> {axis_l / 1024:.0f} KiB = "
             f"{(axis_l - axis_s) / extra:.0f} B per extra cell ({(axis_l - axis_s) / (3 * n_items):.0f}"
             " B per item)")
    rep.note(f"RSS growth during run_plan (5 ms sampling): {cells_s} cells "
             f"{B.median(rss_s) / 2**20:.2f} MiB, {cells_l} cells {B.median(rss_l) / 2**20:.2f} MiB "
             f"(all: {[round(x / 2**20, 2) for x in rss_s]} / {[round(x / 2**20, 2) for x in rss_l]})")
    rep.row("4 memory", "peak traced, 4N cells / N cells", f"{pl / ps:.2f}", "~1 (flat); 4 = linear")
    rep.row("4 memory", "same, prompt gc", f"{gl / gs:.2f}", "~1; growth = item axis only")
    rep.row("4 memory", "held bytes per extra cell (prompt gc)", f"{(gl - gs) / extra:.0f} B",
            f"~item axis: {(axis_l - axis_s) / extra:.0f} B/cell")
    rep.row("4 memory", "RSS growth, 4N - N",
            f"{(B.median(rss_l) - B.median(rss_s)) / 2**20:+.2f} MiB", "~0 (allocator noise)")


# -- 5. store write throughput ------------------------------------------------------------------
def _record(cell_id: str, i: int) -> CallRecord:
    """A realistic call record: a ~2.5 KB prompt, like an amplification prediction batch."""
    return CallRecord(cell_id=cell_id, node="prediction", item=f"batch-{i}", seed=42,
                      exposure_id="prediction:pro_female", exposed=True,
                      prompt_id="amplification/predict", prompt_hash="0123456789abcdef",
                      cache_key=f"{hash((cell_id, i)) & (2**64 - 1):064x}",
                      messages=[{"role": "system", "content": "You predict failure. " * 40},
                                {"role": "user", "content": f"{i}. school=GP sex=F age=17 " * 60}],
                      model={"provider": "scripted", "model": "bench"},
                      params={"temperature": 0.0, "max_tokens": 72, "seed": 42},
                      raw="OUTPUT: [0.10 0.20 0.30 0.40 0.50 0.60 0.70 0.80 0.90 0.95]",
                      parsed=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95],
                      input_tokens=600, output_tokens=20, latency_s=0.01, attempts=1)


def _time_finish(store_dir: Path, n_cells: int, calls_per_cell: int) -> float:
    store = RunStore(store_dir)
    cells = []
    for c in range(n_cells):
        cid = f"E0/math/none/scripted:bench/seed={c}"
        cells.append((cid, [_record(cid, i) for i in range(calls_per_cell)],
                      [("prediction", {"p_llm": [0.5] * 10}), ("finalize", {"ok": True})]))
    spent = 0.0
    for ord_, (cid, calls, outputs) in enumerate(cells):
        store.start_cell(cid, ord_, {"seed": ord_})
        started = time.perf_counter()
        store.finish_cell(cid, calls, outputs)
        spent += time.perf_counter() - started
    store.close()
    return spent


def bench_store(rep: Report, scratch: B.Scratch) -> None:
    rep.section("[5] store write throughput: RunStore.finish_cell, 1 vs 100 calls per cell")
    _time_finish(scratch.new("warm"), 20, 5)
    one, hundred = [], []
    n1, n100 = 600, 8  # 600 and 800 calls
    for _ in range(B.REPEATS):
        one.append(_time_finish(scratch.new("st1"), n1, 1) / n1)
        hundred.append(_time_finish(scratch.new("st100"), n100, 100) / (n100 * 100))
    p1, p100 = B.median(one) * 1e6, B.median(hundred) * 1e6
    rep.note(f"per call: 1 call/cell {p1:.0f} us ({1e6 / p1:.0f} cells/s), 100 calls/cell "
             f"{p100:.0f} us ({1e6 / p100:.0f} calls/s, {1e6 / p100 / 100:.0f} cells/s); "
             f"sqlite {sqlite3.sqlite_version}, WAL, synchronous=NORMAL")
    rep.row("5 store", "per-call cost: 1 call/cell / 100 calls/cell", f"{p1 / p100:.1f}x",
            ">1: per-cell transaction amortised")


BENCHES = {"concurrency": bench_concurrency, "cache": bench_cache, "overhead": bench_overhead,
           "memory": bench_memory, "store": bench_store}


def machine() -> str:
    from machine import describe

    return f"{describe(('langgraph', 'langchain-core'))}, SQLite {sqlite3.sqlite_version}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(BENCHES), help="run only these")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results.md")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHES)
    rep = Report()
    scratch = B.Scratch()
    started = time.perf_counter()
    when = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    try:
        for name in names:
            BENCHES[name](rep, scratch)
    finally:
        scratch.cleanup()
    total = time.perf_counter() - started
    try:
        load = os.getloadavg()
        load_s = f"load average at end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    except OSError:
        load_s = ""
    print()
    print(rep.table())
    print(f"\n{len(names)} benchmarks in {total:.0f} s; {load_s}")
    if args.no_write or args.only:
        return 0
    text = "\n".join([
        "# biaslab benchmark results",
        "",
        f"- date: {when}",
        f"- machine: {machine()}",
        f"- command: `python bench/run.py` ({total:.0f} s in all; {load_s})",
        f"- every figure is a median of {B.REPEATS} repeats; ratios compare measurements "
        "taken in the same run (see bench/README.md for how to read them)",
        "",
        "## Summary",
        "",
        "```",
        rep.table(),
        "```",
        "",
        "## Details (as printed)",
        "",
        "```",
        *rep.details,
        "```",
        "",
    ])
    path = BENCH_DIR / "results.md"
    # Sections other scripts append (bench/local_determinism.py, bench/scale.py) are kept.
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    kept = [part for part in old.split("\n## ")[1:]
            if not part.startswith(("Summary", "Details (as printed)"))]
    if kept:
        text = text.rstrip("\n") + "\n\n" + "\n".join("## " + part for part in kept)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {BENCH_DIR / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
