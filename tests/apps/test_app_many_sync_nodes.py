"""More of an app's sync nodes waiting on their calls at once than asyncio's default executor
has threads, against an endpoint over real HTTP.

LangGraph runs sync nodes in the event loop's default executor, and a sync call there blocks
its thread until the gateway, on the loop, has the answer; opening each HTTP connection to a
host name needs a thread of that same executor (``loop.getaddrinfo``), as does the OpenAI
client's first look at the platform. With asyncio's default, min(32, cores + 4) threads, the
run waited for good once that many supervisors blocked together, its requests never sent
(first seen on a busy machine, where the platform look lost the race for a thread). The
endpoint here, reached by host name, holds every answer until more requests are open at once
than that default could serve.
"""

from __future__ import annotations

import json
import os
import threading

from support_apps import HERE, calls, cli
from support_http import loopback_only
from test_app_routing import SchemaServer

DEFAULT_THREADS = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor


DISCOVERY_CALLS = 4  # the discovery pass: one item, clean, its four calls in turn


class GatheringServer(SchemaServer):
    """Answers nothing until `gather` requests are open together (or `wait_s` passed), after
    the discovery pass's calls, which come one at a time."""

    def __init__(self, gather: int, wait_s: float):
        super().__init__()
        self.gather, self.wait_s = gather, wait_s
        self.open_together = 0
        self._arrived = 0
        self._all_here = threading.Event()
        self._count = threading.Lock()

    def _handle(self, path, headers, body):
        with self._count:
            self._arrived += 1
            waiting = self._arrived - DISCOVERY_CALLS
            self.open_together = max(self.open_together, waiting)
            if waiting >= self.gather:
                self._all_here.set()
        if waiting > 0:
            self._all_here.wait(self.wait_s)
        return super()._handle(path, headers, body)


def test_more_sync_nodes_waiting_than_default_threads_all_get_answers(tmp_path, monkeypatch):
    loopback_only(monkeypatch)
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("BIASLAB_CACHE", "off")
    gather = DEFAULT_THREADS + 1
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"c{i}", "case": f"A post: applicants {60 - i} "
                                         f"and {25 + i}."}) + "\n" for i in range(gather)))
    with GatheringServer(gather, wait_s=20) as server:
        # a host name, as a real endpoint has: an IP address would need no resolution
        host_url = server.base_url.replace("127.0.0.1", "localhost")
        spec = tmp_path / "spec.toml"
        spec.write_text(
            (HERE / "routing_audit.toml").read_text()
            .replace('"routing_items.jsonl"', f'"{items}"').replace('"routing_', f'"{HERE}/routing_')
            .replace('models = ["scripted:routing-synthetic"]', 'models = ["fake"]')
            + "\n[run]\nconcurrency = 256\nmax_attempts = 1\n"
            + f'\n[model_aliases.fake]\nprovider = "openai-compatible"\nmodel = "m"\n'
              f'base_url = "{host_url}"\ntimeout_s = 60\n')
        assert cli("run", spec, "--out", tmp_path / "run", "--quiet", "--no-report") == 0
    # every cell's supervisor asked at once, beyond what asyncio's default threads could hold
    assert server.open_together >= gather
    frame = calls(tmp_path / "run")
    assert frame["cell_id"].nunique() == 3 * gather  # clean, screener and decider arms
    assert (frame["node"] == "supervisor").sum() == 2 * 3 * gather
