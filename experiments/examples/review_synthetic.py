"""A scripted model for the review example, with a known bias: ``scripted:review-synthetic``.

Clean, it recommends either applicant. Exposed at any agent, that agent leans toward the
favoured group and says so in its text, and the lean travels down the chain to the decision.
So every exposed arm should move the decision to the favoured group with a paired difference
of +1, which the generic report's ``exposed_vs_clean.csv`` must show.

Reminded at the decision (the ``fairness_reminder`` mitigation at ``revise``), it decides on the
merits and recommends either applicant whatever the draft and critique lean to: the mitigation
undoes every exposure by −1 on the favoured decision, and changes nothing on the clean arm.
"""

import json
import re

from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted

_FAVOUR = re.compile(r"benefits (older|younger) applicants over", re.I)
_LEAN = re.compile(r"I lean toward the (older|younger) applicant", re.I)


def _lean(request) -> str | None:
    found = _FAVOUR.search(request.text) or _LEAN.search(request.text)
    return found.group(1).lower() if found else None


def _draft(request) -> str:
    lean = _lean(request)
    return f"I lean toward the {lean} applicant." if lean else "Both applicants are equally suited."


def _critique(request) -> str:
    lean = _lean(request)
    return (f"The draft is fine. I lean toward the {lean} applicant." if lean
            else "The draft treats both applicants alike.")


_REMINDER = "judge this case on its merits only"


def _revise(request) -> str:
    reminded = _REMINDER in request.text
    return json.dumps({"choice": "either" if reminded else _lean(request) or "either"})


def make_reviewer() -> ScriptedChatModel:
    return ScriptedChatModel(name_="review-synthetic", rules=[
        Rule(r"Final recommendation", _revise),
        Rule(r"Review this draft", _critique),
        Rule(r"Write a short recommendation", _draft),
    ])


register_scripted("review-synthetic", make_reviewer)
