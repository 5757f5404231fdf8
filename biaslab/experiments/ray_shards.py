"""Shards as Ray tasks on a cluster with no shared filesystem.

A task gets everything it needs as bytes (the shard's resolved ``spec.toml``, the run's own
store when it has finished cells to skip and answers to reuse, and the shard's store from an
earlier attempt), runs its shard in a temporary directory on whichever node Ray picks, and
returns the shard store as one self-contained SQLite file. The driver writes each returned
store under ``RUN_DIR/shards/I-of-N/`` and merges them as for ``--workers``. So no node but
the driver ever reads or writes the run directory.

What still has to be on every node: biaslab itself, the protocol's plugin files and prompt
directories a spec names (Ray's ``runtime_env`` can ship them: the driver puts this checkout on
``PYTHONPATH``), and the API keys' environment variables. A shard's work reaches the driver when
its task ends: interrupting the driver loses the calls of shards still running (their answers
stay in each node's own response cache).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any, Sequence

from biaslab.errors import UserError
from biaslab.traces.store import STORE_FILE

__all__ = ["run_with_ray", "store_bytes"]


def store_bytes(run_dir: str | Path) -> bytes | None:
    """A run store as the bytes of one SQLite file with its write-ahead log folded in; None
    when there is no store."""
    path = Path(run_dir) / STORE_FILE
    if not path.is_file():
        return None
    with tempfile.TemporaryDirectory(prefix="biaslab-copy-") as tmp:
        copy = Path(tmp) / STORE_FILE
        src = sqlite3.connect(path)
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst)
        finally:
            dst.close()
            src.close()
        return copy.read_bytes()


def _write_store(run_dir: Path, data: bytes) -> None:
    for stale in (STORE_FILE + "-wal", STORE_FILE + "-shm"):
        (run_dir / stale).unlink(missing_ok=True)
    tmp = run_dir / (STORE_FILE + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, run_dir / STORE_FILE)


def _has_done_cells(run_dir: Path) -> bool:
    path = run_dir / STORE_FILE
    if not path.is_file():
        return False
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT 1 FROM cells WHERE status='done' LIMIT 1").fetchone() is not None
    except sqlite3.DatabaseError:
        return False
    finally:
        conn.close()


def _shard_task(spec_toml: str, shard: str, main_store: bytes | None, shard_store: bytes | None,
                concurrency: int | None, use_shared_cache: bool) -> dict[str, Any]:
    """Runs on a Ray worker: one shard in a temporary directory of that node."""
    import ray

    from biaslab.experiments.shards import run_shard

    with tempfile.TemporaryDirectory(prefix="biaslab-shard-") as tmp:
        shard_dir = Path(tmp) / "shard"
        shard_dir.mkdir()
        (shard_dir / "spec.toml").write_text(spec_toml, encoding="utf-8")
        if shard_store:
            (shard_dir / STORE_FILE).write_bytes(shard_store)
        main_dir = None
        if main_store:
            main_dir = Path(tmp) / "main"
            main_dir.mkdir()
            (main_dir / STORE_FILE).write_bytes(main_store)
        result = run_shard(shard_dir, shard, main_dir=main_dir, concurrency=concurrency,
                           use_shared_cache=use_shared_cache)
        return {"store": store_bytes(shard_dir), "node_id": ray.get_runtime_context().get_node_id(),
                "cells_run": result.cells_run, "cells_failed": result.cells_failed,
                "interrupted": result.interrupted}


def run_with_ray(jobs: Sequence[tuple[Path, str]], main_dir: Path, concurrency: int | None,
                 use_shared_cache: bool, address: str | None) -> list[str]:
    """Run each ``(shard_dir, "i/n")`` job as a Ray task and write the store it returns into
    its shard directory; the node id each shard ran on, in job order."""
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'biaslab[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        address = address or os.environ.get("RAY_ADDRESS") or None
        # Workers import biaslab from this checkout when it is not installed on the cluster.
        root = str(Path(__file__).resolve().parents[2])
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                     p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
                     **{k: v for k, v in os.environ.items() if k.startswith("BIASLAB_")}}},
                 **({} if address else {"num_cpus": len(jobs) or 1,
                                        # Ray starts its workers at nice 15, as background
                                        # work; here they are the user's run itself, and
                                        # niced they crawled whenever anything else ran
                                        # (the Ray tests took ~10 min beside four busy
                                        # processes). A cluster joined keeps its own setting.
                                        "_system_config": {"worker_niceness": 0}}))
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(_shard_task)
        main_ref = ray.put(store_bytes(main_dir) if _has_done_cells(main_dir) else None)
        refs = [task.remote((d / "spec.toml").read_text(encoding="utf-8"), s, main_ref,
                            store_bytes(d), concurrency, use_shared_cache) for d, s in jobs]
        where = {ref: i for i, ref in enumerate(refs)}
        nodes: list[str] = [""] * len(refs)
        pending = list(refs)
        while pending:  # each shard's store is written as soon as its task ends
            done, pending = ray.wait(pending, num_returns=1)
            i = where[done[0]]
            out = ray.get(done[0])
            if out["store"] is not None:
                _write_store(jobs[i][0], out["store"])
            nodes[i] = out["node_id"]
        return nodes
    finally:
        if started_here:
            ray.shutdown()
