"""One real pass of the amplification graph through the embedded SmolLM2 model."""

import pytest

pytest.importorskip("xllamacpp")

from biaslab.traces.store import RunStore  # noqa: E402
from support_runs import amplification_spec, run_spec  # noqa: E402

pytestmark = pytest.mark.local_model


def test_e0_on_the_embedded_model_parses_under_constrained_decoding(tmp_path, monkeypatch):
    monkeypatch.setenv("BIASLAB_LOCAL_THREADS", "1")
    spec = amplification_spec(models=["local"], options={"pipelines": ["E0"], "max_test": 4},
                              conditions={"directions": ["pro_female"]},
                              run={"concurrency": 2})
    result = run_spec(spec, tmp_path / "run")
    assert result.cells_failed == 0 and result.counters.model_calls == 2
    calls = RunStore(tmp_path / "run").calls()
    assert calls["parse_error"].isna().all()  # the GBNF grammar held the tiny model to format
    assert all(c["grammar"].startswith('root ::= "OUTPUT: ["') for c in calls["params"])
    assert (calls["input_tokens"] > 100).all() and (calls["output_tokens"] > 0).all()
    for parsed in calls["parsed"]:
        assert len(parsed) == 4 and all(0 <= p <= 1 for p in parsed)
