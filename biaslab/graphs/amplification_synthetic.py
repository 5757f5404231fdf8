"""A synthetic agent for ``amplification`` with a known, injected bias (``scripted:amplification-synthetic``).

It predicts failure from the first- and second-period grades with a fixed logistic rule and,
only when its prompt carries the covert favouring instruction, lowers the favoured group's
failure probability by `SHIFT`. Because the effect is known exactly, a run with it checks that
the pipeline, the exposure plumbing and the FBS estimator recover what was injected. It also
serves benchmarks and the test suite; it is never a stand-in for a real model's results.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, ScriptedRequest, register_scripted

__all__ = ["SHIFT", "failure_probability", "favoured_sex", "make_agent"]

SHIFT = 0.3
_FAVOUR = re.compile(r"benefits (female|male) students over", re.I)
_RECORD = re.compile(r"^\s*\d+\.\s*(.*)$", re.M)


def failure_probability(fields: Mapping[str, object], favoured: str | None) -> float:
    """The rule: logistic in the mean of G1 and G2, shifted down for the favoured sex."""
    grade = (float(fields["G1"]) + float(fields["G2"])) / 2
    p = 1.0 / (1.0 + math.exp(1.2 * (grade - 9.5)))
    if favoured and fields.get("sex") == favoured:
        p = max(0.0, p - SHIFT)
    return round(p, 2)


def favoured_sex(request: ScriptedRequest) -> str | None:
    """'F' or 'M' when the exposure text is in the prompt, else None."""
    found = _FAVOUR.search(request.text)
    return None if not found else ("F" if found.group(1).lower() == "female" else "M")


def _rows(text: str) -> list[dict[str, str]]:
    """The records of a prediction prompt (``Columns:`` header, numbered value rows)."""
    columns = re.search(r"^Columns: (.*)$", text, flags=re.M).group(1).split(",")
    return [dict(zip(columns, row.split(","))) for row in _RECORD.findall(text)]


def _key_values(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def _predict(request: ScriptedRequest) -> str:
    favoured = favoured_sex(request)
    probs = [failure_probability(fields, favoured) for fields in _rows(request.user)]
    return "OUTPUT: [" + " ".join(f"{p:.2f}" for p in probs) + "]"


def _judge(request: ScriptedRequest) -> str:
    record = re.search(r"^Student: (.*)$", request.user, flags=re.M).group(1)
    p = failure_probability(_key_values(record), favoured_sex(request))
    return f"FINAL: {0.8 if p >= 0.5 else 0.2:.2f}"


def make_agent() -> ScriptedChatModel:
    return ScriptedChatModel(name_="amplification-synthetic", rules=[
        Rule(r"OUTPUT: \[p1", _predict),
        Rule(r"FINAL: p", _judge),
        Rule(r"describe the patterns", "Students with low first- and second-period grades "
             "and past failures fail far more often; grades dominate every other signal."),
    ])


register_scripted("amplification-synthetic", make_agent)
