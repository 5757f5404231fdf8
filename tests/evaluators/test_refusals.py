"""The refusal rule on replies as hosted models write them (issue 44): typography first,
declines in five vendors' styles, and an opinion disclaimer that goes on to answer."""

import pytest

from biaslab.evaluators import multiturn as mt
from biaslab.evaluators.refusals import is_refusal, plain_text
from support_refusals import LOOK_ALIKES, REFUSALS


def test_the_table_is_as_large_as_the_issue_asks():
    assert len(REFUSALS) >= 30 and len(LOOK_ALIKES) >= 20
    assert len(set(REFUSALS)) == len(REFUSALS) and len(set(LOOK_ALIKES)) == len(LOOK_ALIKES)


@pytest.mark.parametrize("reply", REFUSALS)
def test_refusals_are_caught(reply):
    assert is_refusal(reply) is True


@pytest.mark.parametrize("reply", LOOK_ALIKES)
def test_look_alikes_are_answers(reply):
    assert is_refusal(reply) is False


def test_typographic_and_ascii_spellings_read_the_same():
    for reply in REFUSALS + LOOK_ALIKES:
        ascii_form = plain_text(reply)
        assert not set(ascii_form) & {"\u2019", "\u200b", "\u00a0"}
        assert is_refusal(ascii_form) == is_refusal(reply)
    assert plain_text("I\u00a0can\u2019t\u200b") == "I can't"


def test_the_multiturn_rule_is_this_rule():
    assert mt.is_refusal is is_refusal
    assert mt.is_refusal(None) is None
    assert mt.refusal_rate([REFUSALS[0], LOOK_ALIKES[0], None]) == 0.5
