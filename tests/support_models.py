"""Scripted models importable by subprocesses as ``scripted:support_models:<factory>``."""

from biaslab.graphs.amplification_synthetic import make_agent


def slow_synthetic():
    """The synthetic amplification agent, slowed so a run can be killed mid-way."""
    agent = make_agent()
    agent.latency_s = 0.15
    return agent


STOP_S = 20.0
"""How long a `slow_to_stop_synthetic` call holds the process once it is cancelled."""

HOLD_DIR_ENV = "BIASLAB_TEST_HOLD_DIR"
"""A folder shared with the test: once it holds a file ``hold``, every new call of
`slow_to_stop_synthetic` leaves a ``held-*`` file there and waits until it is cancelled, so a
test can send Ctrl-C knowing a call is in flight (without it, a Ctrl-C that lands between calls
meets nothing to cancel, and the process rightly ends at once)."""


def slow_to_stop_synthetic():
    """The slow synthetic agent, but a cancelled call blocks the process for `STOP_S` before it
    gives up, as an embedded model's native generation does: only a second Ctrl-C that quits
    at once ends such a process quickly."""
    import asyncio
    import os
    import time
    import uuid
    from pathlib import Path

    from biaslab.agents.providers.scripted import ScriptedChatModel

    hold_dir = Path(os.environ[HOLD_DIR_ENV]) if os.environ.get(HOLD_DIR_ENV) else None

    class SlowToStop(ScriptedChatModel):
        async def acomplete(self, messages, kwargs):
            try:
                if hold_dir is not None and (hold_dir / "hold").exists():
                    (hold_dir / f"held-{uuid.uuid4().hex}").touch()
                    await asyncio.sleep(3600)
                return await super().acomplete(messages, kwargs)
            except asyncio.CancelledError:
                time.sleep(STOP_S)
                raise

    agent = make_agent()
    return SlowToStop(name_=agent.name_, rules=agent.rules, latency_s=0.15)


NICE_DIR_ENV = "BIASLAB_TEST_NICE_DIR"
"""A folder where `niceness_recording_synthetic` writes the nice value of each process that
builds it (a shard worker, a Ray task), one file per process."""


def niceness_recording_synthetic():
    """The synthetic amplification agent; building it records this process's nice value."""
    import os
    from pathlib import Path

    folder = os.environ.get(NICE_DIR_ENV)
    if folder:
        (Path(folder) / f"{os.getpid()}.nice").write_text(str(os.nice(0)))
    return make_agent()
