"""An app's own traffic besides its model calls: refused (the cell fails naming the node and
the host) unless the spec allows the host; allowed traffic is recorded in
``tables/app_http.csv`` without credentials; a strict replay sends nothing anywhere."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from biaslab.traces.store import RunStore
from support_apps import cli, copy_app
from support_http import loopback_only

FILES = ("lookup_app.py", "direct_synthetic.py", "panel_items.jsonl")
SPEC = """name = "lookup-audit"
app = "lookup_app.py:graph"
items = "panel_items.jsonl"
plugins = ["direct_synthetic.py"]
models = ["scripted:direct-synthetic"]
{allow}
[outcome]
field = "decision"

[directions.pro_older]
favored = "older applicants"
other = "younger applicants"

[conditions]
targets = ["decider"]
"""


class Records:
    """A records service on 127.0.0.1 that counts every request it gets."""

    def __init__(self):
        self.paths: list[str] = []
        records = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                records.paths.append(self.path)
                body = b'{"age": 58}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def records(monkeypatch):
    server = Records()
    loopback_only(monkeypatch)
    monkeypatch.setenv("RECORDS_URL", f"http://127.0.0.1:{server.port}")
    yield server
    server.close()


def _spec(tmp_path, allow: str = "") -> object:
    copy_app(tmp_path, *FILES)
    spec = tmp_path / "lookup_audit.toml"
    spec.write_text(SPEC.format(allow=allow))
    return spec


def test_a_host_the_spec_does_not_allow_is_refused_naming_node_and_host(tmp_path, records,
                                                                        monkeypatch, capsys):
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "cache.sqlite"))
    spec = _spec(tmp_path)
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"app node 'lookup' opened an HTTP GET (not a model call) to 127.0.0.1:{records.port}" \
        in err[0] and "allow_hosts" in err[0]
    assert "sk-records-secret" not in err[0]
    assert records.paths == []


def test_an_allowed_host_is_reached_and_recorded_and_strict_replay_sends_nothing(
        tmp_path, records, monkeypatch, capsys):
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "cache.sqlite"))
    spec = _spec(tmp_path, f'allow_hosts = ["127.0.0.1:{records.port}"]\n')
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet", "--no-report") == 0
    assert cli("report", tmp_path / "run", "--no-figures") == 0
    reached = len(records.paths)
    assert reached == 2 * 3 * 2 + 2  # (lookup + registry) x 3 items x 2 arms, + discovery
    table = pd.read_csv(tmp_path / "run" / "tables" / "app_http.csv")
    lookups = table[table["node"] == "lookup"]
    assert len(lookups) == 6 and set(lookups["method"]) == {"GET"}
    assert set(lookups["status"]) == {200} and set(lookups["bytes"]) == {11}
    assert set(lookups["url"]) == {f"http://127.0.0.1:{records.port}/records?case=1"}
    assert set(table.loc[table["node"] == "registry", "method"]) == {"CONNECT"}
    assert "sk-records-secret" not in (tmp_path / "run" / "tables" / "app_http.csv").read_text()
    assert "The app&#x27;s own traffic" in (tmp_path / "run" / "report.html").read_text()

    capsys.readouterr()
    assert cli("replay", tmp_path / "run", "--mode", "strict", "--out", tmp_path / "s",
               "--quiet") == 1
    assert records.paths[reached:] == []  # the strict replay sent nothing, allowed host or not
    store = RunStore(tmp_path / "s", readonly=True)
    try:
        errors = set(store.cells()["error"])
    finally:
        store.close()
    assert len(errors) == 1 and "a strict replay sends nothing anywhere" in errors.pop()


@pytest.mark.parametrize("value, needle", [
    ('"127.0.0.1:9000"', "must be a list"),
    ('["http://127.0.0.1:9000/v1"]', "not a URL"),
    ('["127.0.0.1:99999"]', "no valid port"),
    ('[":80"]', "names no host"),
    ('[3]', "is not a"),
])
def test_a_bad_allow_hosts_is_one_line_and_exit_2(tmp_path, capsys, value, needle):
    spec = _spec(tmp_path, f"allow_hosts = {value}\n")
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
