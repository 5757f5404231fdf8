"""Scripted models importable by subprocesses as ``scripted:support_models:<factory>``."""

from biaslab.graphs.amplification_synthetic import make_agent


def slow_synthetic():
    """The synthetic amplification agent, slowed so a run can be killed mid-way."""
    agent = make_agent()
    agent.latency_s = 0.15
    return agent


STOP_S = 20.0
"""How long a `slow_to_stop_synthetic` call holds the process once it is cancelled."""


def slow_to_stop_synthetic():
    """The slow synthetic agent, but a cancelled call blocks the process for `STOP_S` before it
    gives up, as an embedded model's native generation does: only a second Ctrl-C that quits
    at once ends such a process quickly."""
    import asyncio
    import time

    from biaslab.agents.providers.scripted import ScriptedChatModel

    class SlowToStop(ScriptedChatModel):
        async def acomplete(self, messages, kwargs):
            try:
                return await super().acomplete(messages, kwargs)
            except asyncio.CancelledError:
                time.sleep(STOP_S)
                raise

    agent = make_agent()
    return SlowToStop(name_=agent.name_, rules=agent.rules, latency_s=0.15)
