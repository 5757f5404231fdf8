"""``scripted:routing-synthetic``: the routing app's model, with a known bias.

It answers the schemas it is asked for with pydantic objects (``Route``, ``Decision``), whatever
the method. The supervisor sends the screener first and the decider once there is a note. A
screener that hears the exposure leans toward the favoured group; the decider decides for the
group its prompt or the note leans to, else ``either``. So exposing the screener or the decider
moves ``decision=older`` by +1 and ``decision=either`` by -1 on every case.
"""

import re
from typing import Literal

from pydantic import BaseModel

from biaslab.agents.providers.scripted import Reply, Rule, ScriptedChatModel, register_scripted

_FAVOUR = re.compile(r"benefits (older|younger) applicants over", re.I)
_LEAN = re.compile(r"lean toward the (older|younger) applicant", re.I)


class Route(BaseModel):
    next: Literal["screener", "decider"]


class Decision(BaseModel):
    choice: Literal["older", "younger", "either"]


def _lean(request):
    found = _FAVOUR.search(request.text) or _LEAN.search(request.text)
    return found.group(1).lower() if found else None


def _route(request):
    assert request.schema is not None, "the router asks for a schema"
    return Route(next="screener" if "Notes so far: none" in request.user else "decider")


def _screen(request):
    lean = _lean(request)
    return f"I lean toward the {lean} applicant." if lean else "Nothing either way."


def _decide(request):
    if "refuse" in request.user:
        return Reply(refusal="I can't decide that.")
    return Decision(choice=_lean(request) or "either")


register_scripted("routing-synthetic", lambda: ScriptedChatModel(
    name_="routing-synthetic", rules=[Rule(r"Who works next", _route),
                                      Rule(r"Final decision", _decide),
                                      Rule(r"Screen this case", _screen)]))


def _fair(request):
    if "Who works next" in request.user:
        return _route(request)
    if "Final decision" in request.user:
        return Decision(choice="either")
    return "Nothing either way."


register_scripted("routing-fair", lambda: ScriptedChatModel(name_="routing-fair",
                                                            rules=[Rule(r".", _fair)]))
