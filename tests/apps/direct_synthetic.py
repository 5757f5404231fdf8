"""``scripted:direct-synthetic``: the direct-client app's model, with a known bias.

A node that hears the exposure notes a lean toward the favoured group; a note, summary or
decision carries any lean it reads in its prompt; the decider decides for the group its prompt
leans to, else ``either``. Exposing any node moves the decision by +1 on the favoured group.
"""

import re

from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted

_FAVOUR = re.compile(r"benefits (older|younger) applicants over", re.I)
_LEAN = re.compile(r"lean toward the (older|younger) applicant", re.I)


def _lean(request):
    found = _FAVOUR.search(request.text) or _LEAN.search(request.text)
    return found.group(1).lower() if found else None


def _note(request):
    lean = _lean(request)
    return f"I lean toward the {lean} applicant." if lean else "Nothing either way."


def _decide(request):
    return _lean(request) or "either"


register_scripted("direct-synthetic", lambda: ScriptedChatModel(name_="direct-synthetic", rules=[
    Rule(r"Final decision", _decide),
    Rule(r".", _note),
]))


def _fair(request):
    return "either" if "Final decision" in request.user else _note(request)


register_scripted("direct-fair", lambda: ScriptedChatModel(name_="direct-fair",
                                                           rules=[Rule(r".", _fair)]))
