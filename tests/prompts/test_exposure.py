import pytest

from biaslab.errors import UserError
from biaslab.graphs.amplification import Amplification
from biaslab.prompts.exposure import Exposure, apply_exposures, exposure_conditions

DIRS = Amplification.directions


@pytest.mark.parametrize("pipeline, n_targets", [("E0", 1), ("E1", 3), ("E2", 7)])
def test_amplification_conditions_are_every_nonempty_subset_times_directions(pipeline, n_targets):
    nodes = [n.name for n in Amplification().llm_nodes(pipeline, None)]
    conditions = exposure_conditions(nodes, DIRS)
    assert len(conditions) == n_targets * 2 + 1
    assert conditions[0].id == "none" and conditions[0].exposures == ()
    ids = [c.id for c in conditions]
    assert len(set(ids)) == len(ids)
    if pipeline == "E2":
        targets = {c.target for c in conditions[1:]}
        assert targets == {"explanation", "prediction", "judge", "explanation+prediction",
                           "explanation+judge", "prediction+judge",
                           "explanation+prediction+judge"}


def test_singletons_each_and_all_and_explicit_targets():
    nodes = ["a", "b", "c"]
    assert len(exposure_conditions(nodes, DIRS, targets="singletons")) == 3 * 2 + 1
    assert len(exposure_conditions(nodes, DIRS, targets="each_and_all")) == 4 * 2 + 1
    explicit = exposure_conditions(nodes, {"up": {}}, targets=["c+a", ["b"]], include_clean=False)
    assert [c.target for c in explicit] == ["a+c", "b"]  # graph order
    with pytest.raises(UserError, match="'z' is not an LLM node"):
        exposure_conditions(nodes, DIRS, targets=["a+z"])


BASE = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "USER"}]


@pytest.mark.parametrize("position, expected", [
    ("system-append", [("system", "SYS\n\nX"), ("user", "USER")]),
    ("system-replace", [("system", "X"), ("user", "USER")]),
    ("user-prefix", [("system", "SYS"), ("user", "X\n\nUSER")]),
    ("user-suffix", [("system", "SYS"), ("user", "USER\n\nX")]),
])
def test_positions(position, expected):
    out = apply_exposures(BASE, [(position, "X")])
    assert [(m["role"], m["content"]) for m in out] == expected
    assert BASE[0]["content"] == "SYS"  # input untouched


def test_system_append_without_system_message_adds_one():
    out = apply_exposures([{"role": "user", "content": "U"}], [("system-append", "X")])
    assert out == [{"role": "system", "content": "X"}, {"role": "user", "content": "U"}]


def test_bad_position_is_a_user_error():
    with pytest.raises(UserError, match="position must be one of"):
        Exposure(targets=frozenset({"a"}), direction="d", position="middle")


def test_a_single_target_string_is_one_target():
    conditions = exposure_conditions(["a", "b"], {"up": {}}, targets="b", include_clean=False)
    assert [c.target for c in conditions] == ["b"]
