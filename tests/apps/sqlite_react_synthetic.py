"""Scripted models for the SQLite ReAct app, with a known bias.

``scripted:sqlite-react``: looks the applicant up, checks the references, then answers
``either``, or ``older`` when its own prompt carries the exposure favouring older applicants
(so exposing ``agent`` moves the outcome by +1 on ``older``). ``scripted:sqlite-react-thorough``
asks the same, plus one lookup the first never made (``detail = "history"``): a counterfactual
with it at ``agent`` makes a tool call with new arguments. ``scripted:sqlite-decide`` answers
the graph of app (d), which runs its tool itself, with the same bias.
"""

import re

from biaslab.agents.providers.scripted import (Reply, Rule, ScriptedChatModel, ToolCall,
                                               register_scripted)


def _applicant(request) -> str:
    return re.search(r"applicant (a\d+)", request.user).group(1)


def _answer(request) -> str:
    favour = re.search(r"benefits (older|younger) applicants over", request.system)
    return favour.group(1) if favour else "either"


def _step(request):
    done, who = len(request.tool_results), _applicant(request)
    if done == 0:
        return Reply(tool_calls=[ToolCall("lookup_record", {"applicant": who}, f"look-{who}")])
    if done == 1:
        return Reply(tool_calls=[ToolCall("check_references", {"applicant": who},
                                          f"ref-{who}")])
    return _answer(request)


def _thorough(request):
    done, who = len(request.tool_results), _applicant(request)
    if done == 0:
        return Reply(tool_calls=[ToolCall("lookup_record", {"applicant": who}, f"look-{who}")])
    if done == 1:
        return Reply(tool_calls=[ToolCall("lookup_record", {"applicant": who,
                                                            "detail": "history"},
                                          f"history-{who}")])
    if done == 2:
        return Reply(tool_calls=[ToolCall("check_references", {"applicant": who},
                                          f"ref-{who}")])
    return _answer(request)


register_scripted("sqlite-react", lambda: ScriptedChatModel(
    name_="sqlite-react", rules=[Rule(r"applicant a\d", _step)]))
register_scripted("sqlite-react-thorough", lambda: ScriptedChatModel(
    name_="sqlite-react-thorough", rules=[Rule(r"applicant a\d", _thorough)]))
register_scripted("sqlite-decide", lambda: ScriptedChatModel(
    name_="sqlite-decide", rules=[Rule(r"applicant a\d", _answer)]))
