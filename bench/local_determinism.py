"""What deterministic mode costs the embedded model: ``python bench/local_determinism.py``.

Issue 6 section 3: llama.cpp's answers depend on prompt-cache reuse and on what shares the batch,
so `LocalChatModel` now (by default) recomputes every prompt and serializes calls per server
(see the docstring of biaslab/agents/providers/local.py). This measures the price, in one
process: 12 short judge-style requests (a ~110-token prompt sharing its system prompt with the
others, 16 tokens out), at concurrency 1 and 4, with determinism on and off (off = the old
behaviour: prefix reuse, 2 slots batched together). Every timed batch gets fresh prompts, so
"off" gains from the shared system prompt only, as in a real run, not from exact repeats.

Reported as RATIOS on/off (median of 3 interleaved repeats, ``time.perf_counter``), and, untimed,
how many of 12 answers change when the same requests run at concurrency 4 instead of 1.
About 1–3 minutes on 2 cores with 1 llama.cpp thread (``BIASLAB_LOCAL_THREADS``, default 1 here).

    python bench/local_determinism.py            # print only
    python bench/local_determinism.py --append   # also append a section to bench/results.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("BIASLAB_LOCAL_THREADS", "1")

from langchain_core.messages import HumanMessage, SystemMessage  # noqa: E402

from biaslab.agents.providers.local import LocalChatModel  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPEATS = 3
N_REQUESTS = 12
CONCURRENCY = (1, 4)
MAX_TOKENS = 16
SYSTEM = ("You arbitrate between two predictors of whether a student fails the final exam "
          "(final grade below 10 out of 20). You must commit to one side.")


def requests(batch: int) -> list[list]:
    """12 distinct judge-style prompts; `batch` makes every timed batch's prompts new."""
    out = []
    for i in range(N_REQUESTS):
        k = batch * N_REQUESTS + i
        out.append([SystemMessage(SYSTEM), HumanMessage(
            f"Student {k}: age {15 + k % 5}, studytime {1 + k % 4}, failures {k % 3}, absences "
            f"{(7 * k) % 23}, G1 {6 + k % 9}, G2 {5 + (3 * k) % 11}.\nA language-model predictor "
            f"gives 0.{20 + k % 70:02d}; a gradient-boosting model gives 0.{85 - k % 60:02d}. "
            "Decide. Reply with exactly one line: FINAL: p")])
    return out


def timed(model: LocalChatModel, batch: list, concurrency: int) -> tuple[float, int, list[str]]:
    """Wall time, generated tokens and answers of one batch at a given concurrency."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        msgs = list(pool.map(lambda m: model.invoke(m, max_tokens=MAX_TOKENS), batch))
    elapsed = time.perf_counter() - started
    return elapsed, sum(m.usage_metadata["output_tokens"] for m in msgs), [m.content for m in msgs]


def machine() -> str:
    from machine import describe

    return describe(("xllamacpp",))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--append", action="store_true", help="append to bench/results.md")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    models = {"on": LocalChatModel(deterministic=True, n_ctx=4096, n_parallel=2),
              "off": LocalChatModel(deterministic=False, n_ctx=4096, n_parallel=2)}
    for model in models.values():
        model.load()
        model.invoke("hi", max_tokens=2)  # warm up outside the timing
    # (mode, conc) -> lists of seconds and generated tokens per repeat
    secs: dict[tuple, list[float]] = {}
    toks: dict[tuple, list[int]] = {}
    batch = 0
    for _ in range(REPEATS):  # interleaved, so drifting machine load hits every arm alike
        for conc in CONCURRENCY:
            for mode, model in models.items():
                batch += 1
                s, n, _ = timed(model, requests(batch), conc)
                secs.setdefault((mode, conc), []).append(s)
                toks.setdefault((mode, conc), []).append(n)
    # Untimed: the same 12 requests at concurrency 1, then 4; how many answers change?
    changed = {}
    for mode, model in models.items():
        reqs = requests(10_000)
        _, _, one = timed(model, reqs, 1)
        _, _, four = timed(model, reqs, 4)
        changed[mode] = sum(a != b for a, b in zip(one, four))
    total = time.perf_counter() - began

    def tps(mode, conc):
        return statistics.median(n / s for n, s in zip(toks[mode, conc], secs[mode, conc]))

    def cps(mode, conc):
        return statistics.median(N_REQUESTS / s for s in secs[mode, conc])

    rows = [("arm", "generated tokens/s", "calls/s", "seconds per batch of 12 (min-max)")]
    for conc in CONCURRENCY:
        for mode in models:
            s = secs[mode, conc]
            rows.append((f"determinism {mode}, concurrency {conc}", f"{tps(mode, conc):.1f}",
                         f"{cps(mode, conc):.2f}",
                         f"{statistics.median(s):.2f} ({min(s):.2f}-{max(s):.2f})"))
    ratios = [("ratio", "measured", "meaning")]
    for conc in CONCURRENCY:
        ratios.append((f"calls/s on / off, concurrency {conc}",
                       f"{cps('on', conc) / cps('off', conc):.2f}", "1.0 = free; <1 = cost"))
        ratios.append((f"tokens/s on / off, concurrency {conc}",
                       f"{tps('on', conc) / tps('off', conc):.2f}", "same, generated tokens"))
    for mode in models:
        ratios.append((f"calls/s conc 4 / conc 1, determinism {mode}",
                       f"{cps(mode, 4) / cps(mode, 1):.2f}", "what concurrency buys"))
        ratios.append((f"answers changed, conc 4 vs 1, determinism {mode}",
                       f"{changed[mode]}/{N_REQUESTS}", "0 = reproducible"))

    def table(rs):
        widths = [max(len(r[i]) for r in rs) for i in range(len(rs[0]))]
        fmt = lambda r: " | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
        return "\n".join([fmt(rs[0]), "-+-".join("-" * w for w in widths), *map(fmt, rs[1:])])

    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    text = "\n".join([
        "## Local model: determinism on vs off (`bench/local_determinism.py`)", "",
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine()}",
        f"- command: `python bench/local_determinism.py --append` ({total:.0f} s in all; load "
        f"average at end {load})",
        f"- {N_REQUESTS} judge-style requests (~110 prompt tokens, {MAX_TOKENS} out, SmolLM2-135M "
        f"Q4_1, 2 slots), fresh prompts per batch, median of {REPEATS} interleaved repeats",
        "", "```", table(ratios), "", table(rows), "```", ""])
    print(text)
    if args.append:
        with open(BENCH_DIR / "results.md", "a") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
