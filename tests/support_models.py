"""Scripted models importable by subprocesses as ``scripted:support_models:<factory>``."""

from biaslab.graphs.amplification_synthetic import make_agent


def slow_synthetic():
    """The synthetic amplification agent, slowed so a run can be killed mid-way."""
    agent = make_agent()
    agent.latency_s = 0.15
    return agent
