"""Tests for biaslab.evaluators.votes.majority_vote."""

from __future__ import annotations

import pytest

from biaslab.evaluators.votes import VoteResult, majority_vote


def test_clear_majority():
    res = majority_vote(["A", "B", "A", "A", "C"])
    assert res == VoteResult(label="A", count=3, tie=False, counts={"A": 3, "B": 1, "C": 1}, unscored=0)


def test_tie_is_reported_not_broken():
    res = majority_vote(["A", "B", "B", "A", "C"])
    assert res.label is None and res.tie and res.count == 2
    assert res.counts == {"A": 2, "B": 2, "C": 1}


def test_unscored_labels_are_ignored_and_counted():
    res = majority_vote([None, "B", "A", None, "B", float("nan")])
    assert res.label == "B" and res.count == 2 and not res.tie
    assert res.unscored == 3
    assert res.counts == {"B": 2, "A": 1}


def test_none_can_break_what_would_otherwise_be_a_tie_only_by_being_ignored():
    # Two judges say A, two say B, one failed: still a tie.
    res = majority_vote(["A", "B", None, "A", "B"])
    assert res.tie and res.label is None and res.unscored == 1


@pytest.mark.parametrize("labels, unscored", [([None, None, None], 3), ([], 0)])
def test_no_scored_votes(labels, unscored):
    res = majority_vote(labels)
    assert res == VoteResult(label=None, count=0, tie=False, counts={}, unscored=unscored)


def test_single_vote_and_non_string_labels():
    assert majority_vote([0]).label == 0
    res = majority_vote([1, 0, 1, (2, 3), (2, 3), 1])
    assert res.label == 1 and res.count == 3
    # k judges x r repeats, flattened: 3 judges x 2 repeats.
    votes = [["yes", "yes"], ["no", "yes"], ["no", None]]
    res = majority_vote([v for judge in votes for v in judge])
    assert res.label == "yes" and res.count == 3 and res.unscored == 1


def test_accepts_any_iterable():
    assert majority_vote(iter(["x", "y", "x"])).label == "x"


def test_bad_input_raises():
    with pytest.raises(ValueError, match="hashable"):
        majority_vote([["a"], ["a"]])
    with pytest.raises(ValueError, match="single string"):
        majority_vote("AAB")
