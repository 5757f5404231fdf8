"""biaslab's readers against a person's readings of real answers.

``biaslens_readings.csv`` holds 515 answers from the six models' released answers, drawn at
random (at least 30 per model and family where biaslab and the authors' script disagreed, all
of a family when fewer), each read by a person: the label (a group's letter, the last option,
yes/no, ``nonanswer``/``refusal``, or ``unparsed`` for an empty reply) and why. The readers
must agree with every reading; the map (docs/protocols/roleplay.md §3) counts them per family.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from biaslab.agents.parsers import ParseError
from biaslab.datasets.biaslens import choice_options
from biaslab.evaluators import roleplay_released as rr
from biaslab.evaluators.roleplay_replies import read_choice, read_yes_no

READINGS = pd.read_csv(Path(__file__).with_name("biaslens_readings.csv"), dtype=str,
                       keep_default_na=False)


def _read(row) -> str:
    try:
        if row.type == "yes_no":
            return read_yes_no(row.answer).label
        return read_choice(row.answer, [(o.letter, o.text)
                                        for o in choice_options(row.question)]).label
    except ParseError:
        return "unparsed"


def test_the_readings_cover_every_model_and_are_read_by_a_person():
    assert len(READINGS) == 515
    assert set(READINGS["model"]) == {"gpt4omini", "mistral", "deepseek", "llama3_70b",
                                      "llama3_8b", "qwen"}
    assert (READINGS["why"].str.len() > 10).all()


def test_the_readers_agree_with_every_reading():
    disagree = [(r.model, r.answer[:80], r.label, _read(r)) for r in READINGS.itertuples()
                if _read(r) != r.label]
    assert disagree == []


def test_where_biaslab_and_the_script_differ_the_readings_side_with_biaslab():
    """For each reading in a family (biaslab and the script read it differently), the
    person's verdict (biased: Yes, or a group picked) is biaslab's, never the script's."""
    frame = READINGS.rename(columns={"label": "reading"}).assign(final="", attribute="", role="")
    scored = rr.score_released(frame)
    differing = scored[scored["family"].notna()]
    assert len(differing) >= 300
    person = [(r.reading == "yes") if r.type == "yes_no"
              else (r.reading not in ("nonanswer", "unparsed",
                                      choice_options(r.question)[-1].letter))
              for r in differing.itertuples()]
    assert list(differing["biased"]) == person
    assert all(rr.FAMILIES[f].script_wrong for f in differing["family"])
