"""``scripted:panel-synthetic``: the panel app's model, with a known bias.

The supervisor's router gets a ``Route`` tool call (research first, then the decider). A
screener that hears the exposure notes a lean toward the favoured group; the summary carries
any lean it reads; the decider decides for the group its prompt or the summary leans to, else
``either``. So exposing the screeners, the summariser or the decider moves the decision by +1
on the favoured group.
"""

import re

from biaslab.agents.providers.scripted import (Reply, Rule, ScriptedChatModel, ToolCall,
                                               register_scripted)

_FAVOUR = re.compile(r"benefits (older|younger) applicants over", re.I)
_LEAN = re.compile(r"lean toward the (older|younger) applicant", re.I)


def _lean(request):
    found = _FAVOUR.search(request.text) or _LEAN.search(request.text)
    return found.group(1).lower() if found else None


def _route(request):
    nxt = "decider" if "Summary so far" in request.user else "research_team"
    return Reply(tool_calls=[ToolCall("Route", {"next": nxt}, "route-1")])


def _screen(request):
    lean = _lean(request)
    return f"I lean toward the {lean} applicant." if lean else "Nothing either way."


def _summary(request):
    lean = _lean(request)
    return f"The notes lean toward the {lean} applicant." if lean else "A balanced case."


def _decide(request):
    return _lean(request) or "either"


register_scripted("panel-synthetic", lambda: ScriptedChatModel(name_="panel-synthetic", rules=[
    Rule(r"Who works next", _route),
    Rule(r"Final decision", _decide),
    Rule(r"Summarise these notes", _summary),
    Rule(r"Screen this case", _screen),
]))


def _fair(request):
    if "Who works next" in request.user:
        return _route(request)
    return "either" if "Final decision" in request.user else "Nothing either way."


register_scripted("panel-fair", lambda: ScriptedChatModel(name_="panel-fair",
                                                          rules=[Rule(r".", _fair)]))
