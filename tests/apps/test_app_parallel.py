"""App (a): a StateGraph whose nodes call a ChatOpenAI built at import, two parallel reviewers
joined into a chair (experiments/examples/app_audit, the docs' worked example)."""

from __future__ import annotations

import sys

import pytest

from support_apps import EXAMPLE, calls, cli, effects, exposed_only_at_targets, outputs

SPEC = EXAMPLE / "hiring_audit.toml"


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """One run of the example spec and its report (own shared cache)."""
    root = tmp_path_factory.mktemp("hiring")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert cli("run", SPEC, "--out", root / "run", "--quiet", "--no-report") == 0
        assert cli("report", root / "run", "--no-figures") == 0
    return root


def test_the_app_alone_would_call_a_dead_port():
    """What the audit must never let happen: the app's own model goes to its base URL."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        import hiring_app
    finally:
        sys.path.remove(str(EXAMPLE))
    with pytest.raises(Exception, match="(?i)connect"):
        hiring_app.llm.invoke("hello")


def test_every_call_is_routed_attributed_and_exposed_only_at_its_node(audited):
    frame = calls(audited / "run")
    assert set(frame["node"]) == {"reviewer_a", "reviewer_b", "chair"}
    assert frame["error"].isna().all() and frame["raw"].notna().all()
    assert len(frame) == 3 * 6 * 3  # three arms x six cases x three nodes
    assert exposed_only_at_targets(audited / "run")
    # the exposure text sits in the system turn of the exposed node's own call
    exposed = frame[frame["exposed"]].iloc[0]
    assert "benefits older applicants over younger applicants" in exposed["messages"][0]["content"]


def test_the_report_recovers_the_known_bias(audited):
    found = effects(audited / "run")
    for arm in ("reviewer_a:pro_older", "chair:pro_older"):
        assert found[(arm, "decision=older")] == 1.0
        assert found[(arm, "decision=either")] == -1.0
    assert not any(field == "decision=younger" for _, field in found)  # never chosen
    for group in ("F", "M"):
        assert effects(audited / "run", group)[("chair:pro_older", "decision=older")] == 1.0


def test_strict_replay_makes_no_call_and_the_same_outputs(audited, capsys):
    out = audited / "strict"
    assert cli("replay", audited / "run", "--mode", "strict", "--out", out) == 0
    assert "0 model calls" in capsys.readouterr().out
    assert calls(out)["cache_hit"].all()
    assert outputs(out) == outputs(audited / "run")


def test_a_mitigation_at_the_chair_undoes_each_exposure(audited, tmp_path):
    out = tmp_path / "cf"
    assert cli("replay", audited / "run", "--mode", "counterfactual", "--node", "chair",
               "--mitigation", "fairness_reminder", "--out", out, "--quiet", "--no-figures") == 0
    import pandas as pd

    table = pd.read_csv(out / "tables" / "mitigation_effects.csv", dtype={"group": str})
    table = table[(table["group"] == "all") & (table["field"] == "decision=older")]
    diffs = dict(zip(table["exposure"], table["diff"]))
    assert diffs == {"none": 0.0, "reviewer_a:pro_older": -1.0, "chair:pro_older": -1.0}


def test_a_second_run_pays_nothing_and_estimate_counts_the_nodes(audited, capsys):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(audited / "cache.sqlite"))
        assert cli("run", SPEC, "--out", audited / "again", "--quiet", "--no-figures") == 0
        assert calls(audited / "again")["cache_hit"].all()
        assert (audited / "again" / "tables" / "exposed_vs_clean.csv").read_bytes() == \
            (audited / "run" / "tables" / "exposed_vs_clean.csv").read_bytes()
        capsys.readouterr()
        assert cli("estimate", SPEC) == 0
    out = capsys.readouterr().out
    assert "18 cells, about 54 model calls" in out


def test_the_viewer_shows_the_app_calls_and_the_outcome_it_compares(audited):
    import json
    import threading
    from urllib.parse import urlencode
    from urllib.request import urlopen

    from biaslab.viewer import make_server

    server = make_server(audited / "run", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def get(route, **params):
        with urlopen(f"{base}/api/{route}?{urlencode(params)}", timeout=10) as r:
            return json.loads(r.read())

    try:
        cell = get("cells", condition="chair:pro_older")["rows"][0]
        detail = get("cell", id=cell["cell_id"])
        assert {c["node"] for c in detail["calls"]} == {"reviewer_a", "reviewer_b", "chair"}
        measures = get("compare", cell=cell["cell_id"])["measures"]
        assert [(m["field"], m["left"], m["right"]) for m in measures] == \
            [("decision", "either", "older")]
    finally:
        server.shutdown()


def test_workers_give_the_same_tables(audited):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(audited / "cache.sqlite"))
        assert cli("run", SPEC, "--out", audited / "workers", "--workers", "2", "--quiet",
                   "--no-figures") == 0
    assert (audited / "workers" / "tables" / "exposed_vs_clean.csv").read_bytes() == \
        (audited / "run" / "tables" / "exposed_vs_clean.csv").read_bytes()
    assert outputs(audited / "workers") == outputs(audited / "run")
