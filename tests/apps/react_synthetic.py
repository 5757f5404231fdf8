"""``scripted:react-synthetic``: drives the ReAct agent's tool loop with a known bias.

First turn: it calls ``lookup_record``; second: ``check_references``; then it answers. Clean
it answers ``either``; when its own prompt carries the exposure favouring older applicants it
answers ``older``. So exposing the agent node moves the outcome by +1 on ``older``.
"""

import re

from biaslab.agents.providers.scripted import (Reply, Rule, ScriptedChatModel, ToolCall,
                                               register_scripted)


def _applicant(request) -> str:
    return re.search(r"applicant (a\d+)", request.user).group(1)


def _step(request):
    done = request.tool_results
    who = _applicant(request)
    if not done and "lookup_record" in request.tools:
        return Reply(tool_calls=[ToolCall("lookup_record", {"applicant": who}, f"look-{who}")])
    if len(done) == 1:
        return Reply(content="Checking references.",
                     tool_calls=[ToolCall("check_references", {"applicant": who}, f"ref-{who}")])
    favour = re.search(r"benefits (older|younger) applicants over", request.system)
    return favour.group(1) if favour else "either"


register_scripted("react-synthetic", lambda: ScriptedChatModel(
    name_="react-synthetic", rules=[Rule(r"applicant a\d", _step)]))
