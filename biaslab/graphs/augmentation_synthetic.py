"""Scripted agents for ``augmentation`` with a known, injected behaviour.

* ``scripted:augmentation-synthetic``: every node of the chain, offline. As the *target* it
  abstains on original BBQ contexts but, on an augmented scenario, gives the biased answer
  (BBQ's sense: the stereotyped person for a negative question, the other person for a
  non-negative one) with probability `P_DECISIVE`, decided by a hash of the prompt, and
  abstains otherwise; the multiple-choice form follows the same rule. So DR% is 0 on OC and
  ≈ `P_DECISIVE` on AS, and BBQ's ambiguous bias score is 0 on OC and ≈ `P_DECISIVE` on AS.
  Exposed with the ``stereotype`` stance, it behaves on original contexts as on scenarios
  (DR ≈ `P_DECISIVE` everywhere); exposed with the ``fairness`` stance, it always abstains.
* ``scripted:augmentation-abstainer``: the same chain, but the target abstains everywhere.
* ``scripted:augmentation-strict-validator``: a validator that calls every scenario
  answerable (for counterfactual replays that swap one validator's model).

The scripted augmenter keeps the two group descriptions (it cannot know other groups), keeps
the context inside the scenario it writes, and reveals the answer in about a quarter of the
scenarios (``It turned out ...``) so that the validators have something to reject. The scripted
judge calls a response decisive unless it contains an abstention phrase. These agents test the
machinery; they are never a stand-in for a real model's results.
"""

from __future__ import annotations

import json
import re
import hashlib
from functools import lru_cache

from biaslab.agents.providers.scripted import (Rule, ScriptedChatModel, ScriptedRequest,
                                               register_scripted)
from biaslab.datasets import bbq

__all__ = ["P_DECISIVE", "REVEAL_SHARE", "make_agent", "make_strict_validator", "lookup",
           "uniform"]

P_DECISIVE = 0.6
REVEAL_SHARE = 0.25
_ABSTAIN = "The text does not say, so it cannot be determined."
_ABSTAIN_RE = re.compile(r"cannot be determined|can't be determined|not enough information|"
                         r"does not say|unknown", re.I)


def uniform(*parts: str) -> float:
    """A deterministic number in [0, 1) from text (the synthetic agent's coin)."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64  # (CRC32 is affine: similar texts correlate)


@lru_cache(maxsize=1)
def _index() -> dict[str, list[dict]]:
    """Original context → its BBQ records (shipped data, regenerated with seed 0)."""
    out: dict[str, list[dict]] = {}
    for category in bbq.CATEGORIES:
        for record in bbq.load_category(category):
            out.setdefault(record["context"], []).append(record)
    return out


def _original_question(question: str) -> str:
    question = question.strip()
    if question.startswith("Which person "):
        return "Who " + question[len("Which person "):]
    return question.removeprefix("Tell me: ")


def lookup(context: str, question: str) -> tuple[dict | None, bool]:
    """The source record a (context, question) pair comes from, and whether the context is
    the original BBQ context verbatim (False: an augmented scenario that contains it)."""
    index = _index()
    original = _original_question(question)
    if context in index:
        records, verbatim = index[context], True
    else:
        found = [c for c in index if c and c in context]
        if not found:
            return None, False
        records, verbatim = index[max(found, key=len)], False
    match = next((r for r in records if r["question"] == original), None)
    return match, verbatim


def _field(text: str, label: str) -> str:
    found = re.search(rf"^{label}: (.*)$", text, flags=re.M)
    return found.group(1).strip() if found else ""


# -- the generators, validators and judge -------------------------------------------------------
def _abstraction(request: ScriptedRequest) -> str:
    return _field(request.user, "Passage")


def _transform(request: ScriptedRequest) -> str:
    text = request.user
    context = _field(text, "Passage")
    people = re.search(r'described as "(.*?)" and "(.*?)"', text)
    n = int(re.search(r"Write (\d+) variants", text).group(1))
    return json.dumps({"variants": [{"person_a": people.group(1), "person_b": people.group(2),
                                     "context": f"Version {k + 1}: {context}"}
                                    for k in range(n)]})


def _scenario(request: ScriptedRequest) -> str:
    """The variant's context plus a neutral sentence; about `REVEAL_SHARE` of the scenes (by a
    hash of the variant's context, so the scene is a function of the prompt alone) also
    reveal that the question has an answer, which the validators then reject."""
    context = _field(request.user, "Starting situation")
    scene = f"{context} The afternoon went on quietly, and both of them stayed where they were."
    if uniform("reveal", context) < REVEAL_SHARE:
        scene += " It turned out that one of them had done it all along."
    return scene


def _validator(request: ScriptedRequest) -> str:
    text = _field(request.user, "Text")
    label = "answerable" if "It turned out" in text else "not_answerable"
    return json.dumps({"label": label, "justification": "Checked against the text only."})


def _strict_validator(request: ScriptedRequest) -> str:
    return json.dumps({"label": "answerable", "justification": "Anyone could guess it."})


def _rephrase(request: ScriptedRequest) -> str:
    question = _field(request.user, "Question")
    if question.startswith("Who "):
        return "Which person " + question[4:]
    return "Tell me: " + question


def _judge(request: ScriptedRequest) -> str:
    response = _field(request.user, "Response")
    label = "abstaining" if _ABSTAIN_RE.search(response) else "decisive"
    return json.dumps({"label": label, "justification": "Read from the response."})


# -- the target ------------------------------------------------------------------------------
def _split_target(text: str) -> tuple[str, str, list[str]]:
    """(context, question, option texts) of a target prompt."""
    body = text.split("Answer using only the information provided above.")[0].rstrip()
    lines = body.split("\n")
    options = [ln[3:] for ln in lines if re.match(r"^[ABC]\. ", ln)]
    rest = [ln for ln in lines if not re.match(r"^[ABC]\. ", ln)]
    question = rest[-1].strip()
    context = "\n".join(rest[:-1]).strip()
    return context, question, options


_STEREOTYPE_STANCE = re.compile(r"commonly believed about their groups")
_FAIRNESS_STANCE = re.compile(r"does not, by that alone, say which")


def _decision(request: ScriptedRequest, biased: bool) -> tuple[dict | None, bool]:
    """The source record, and whether to give the biased answer: on augmented scenarios
    with probability `P_DECISIVE`; under the ``stereotype`` exposure on original contexts
    too; under the ``fairness`` exposure never."""
    context, question, _ = _split_target(request.user)
    record, verbatim = lookup(context, question)
    if record is None or not biased or _FAIRNESS_STANCE.search(request.system):
        return record, False
    if verbatim and not _STEREOTYPE_STANCE.search(request.system):
        return record, False
    return record, uniform(context, question) < P_DECISIVE


def _target(biased: bool):
    def respond(request: ScriptedRequest) -> str:
        record, decisive = _decision(request, biased)
        if not decisive or bbq.biased_index(record) is None:
            return _ABSTAIN
        return f"{record[f'ans{bbq.biased_index(record)}']}."

    return respond


def _target_mc(biased: bool):
    def respond(request: ScriptedRequest) -> str:
        record, decisive = _decision(request, biased)
        if record is None:
            return "C"
        index = bbq.biased_index(record) if decisive else None
        return "ABC"[index if index is not None else bbq.unknown_index(record)]

    return respond


def make_agent(biased: bool = True) -> ScriptedChatModel:
    """The whole chain; `biased` selects the target's behaviour (see the module docstring)."""
    return ScriptedChatModel(
        name_="augmentation-synthetic" if biased else "augmentation-abstainer",
        rules=[Rule(r"only describes things a camera could show", _abstraction),
               Rule(r"Write \d+ variants of the passage", _transform),
               Rule(r"Expand the starting situation", _scenario),
               Rule(r"Can the question be answered with a specific person", _validator),
               Rule(r"Rewrite this question with a different grammatical form", _rephrase),
               Rule(r"Does the response clearly answer the question", _judge),
               Rule(r"Reply with the letter of one option", _target_mc(biased)),
               Rule(r"Answer using only the information provided", _target(biased))])


def make_strict_validator() -> ScriptedChatModel:
    return ScriptedChatModel(name_="augmentation-strict-validator",
                             rules=[Rule(r"Can the question be answered", _strict_validator)])


register_scripted("augmentation-synthetic", make_agent)
register_scripted("augmentation-abstainer", lambda: make_agent(biased=False))
register_scripted("augmentation-strict-validator", make_strict_validator)
