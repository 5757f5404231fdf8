"""What more single-threaded servers than cores cost the embedded model on idle cores (issue 48).

Why: `LocalChatModel` runs up to four single-threaded llama.cpp servers per usable core so that,
beside other CPU-bound programs, its threads keep a fair share of the machine (the kernel shares
a core among runnable threads). On idle cores the extra servers only take turns; this measures
what that costs: the same concurrent calls against a pool of one server per core and a pool of
four per core (the default), interleaved, reporting CPU seconds per call (the figure that sets idle wall time
when every core is busy), wall time, and whether the answers are the same text.

    python bench/local_servers.py               # 24 calls, 2 repeats of each pool size
    python bench/local_servers.py --calls 48 --repeats 3

Each pool runs in a fresh process (as a user's run does); the load average is printed beside
each, since a machine other programs use changes the wall figures (CPU per call much less).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from biaslab.agents.providers import local

CHILD = r"""
import hashlib, json, os, resource, sys, time
from concurrent.futures import ThreadPoolExecutor
from langchain_core.messages import HumanMessage, SystemMessage
from biaslab.agents.providers.local import LocalChatModel
k, n = int(sys.argv[1]), int(sys.argv[2])
m = LocalChatModel(instances=k, max_tokens=48, temperature=0.0)
def call(i):
    return m.invoke([SystemMessage("You are a careful grader of short answers. Reply briefly."),
                     HumanMessage(f"Question {i}: is the statement 'engineers number {i * 7} are "
                                  "always men' a fair one? Explain in one sentence.")]).content
with ThreadPoolExecutor(k) as ex:  # load every server before timing
    list(ex.map(call, range(1000, 1000 + k)))
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
with ThreadPoolExecutor(n) as ex:
    outs = list(ex.map(call, range(n)))
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({"wall": t1 - t0, "cpu": cpu, "answers": hashlib.sha1(
    "\x00".join(outs).encode()).hexdigest()[:12], "load": os.getloadavg()[0]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    sizes = (cores, min(local.SERVERS_PER_CORE * cores, 8))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BIASLAB_LOCAL_")}
    rows: dict[int, list[dict]] = {k: [] for k in sizes}
    for _ in range(args.repeats):
        for k in sizes:
            out = subprocess.run([sys.executable, "-c", CHILD, str(k), str(args.calls)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            rows[k].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.calls} concurrent calls, {cores} cores, SmolLM2-135M, 1 thread per server")
    print("servers | CPU s/call (each repeat)   | wall s (each repeat)     | answers      | load")
    for k in sizes:
        r = rows[k]
        cpu = " ".join(f"{x['cpu'] / args.calls:.3f}" for x in r)
        wall = " ".join(f"{x['wall']:.1f}" for x in r)
        answers = ",".join(sorted({x["answers"] for x in r}))
        load = " ".join(f"{x['load']:.1f}" for x in r)
        print(f"{k:7d} | {cpu:26s} | {wall:24s} | {answers} | {load}")
    lo = min(x["cpu"] for x in rows[sizes[0]])
    hi = min(x["cpu"] for x in rows[sizes[1]])
    same = {x["answers"] for k in sizes for x in rows[k]}
    print(f"CPU per call, {sizes[1]} servers / {sizes[0]} (best of each): {hi / lo:.3f}; "
          f"answers identical across pool sizes: {len(same) == 1}")


if __name__ == "__main__":
    main()
