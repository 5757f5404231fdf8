"""How the synthetic agents notice a mitigation arm, so that its effect on them is known.

The scripted agents of the built-in protocols (``*_synthetic.py``) react to the packaged
mitigation templates by their words, the way they react to an exposure's stance:

- `reminded`: the prompt holds the words of ``mitigations/fairness_reminder``. Each synthetic
  module documents what its agents then do (a roleplay or augmentation target never answers
  biased, a multiturn target is never biased, a roleplay judge ignores its exposure).
- `self_checking`: the request is the follow-up of ``mitigations/self_check`` (the node's own
  answer, then the request to review it). The synthetic targets then give the answer they
  would give when reminded, so a self-check undoes what the first answer did.

These are rules of the test agents only, never a claim about a real model.
"""

from __future__ import annotations

from biaslab.agents.providers.scripted import ScriptedRequest

__all__ = ["REMINDER_WORDS", "SELF_CHECK_WORDS", "reminded", "self_checking"]

REMINDER_WORDS = "judge this case on its merits only"
"""Words of ``prompts/mitigations/fairness_reminder.toml``."""
SELF_CHECK_WORDS = "Read your answer above again"
"""Words of ``prompts/mitigations/self_check.toml``."""


def reminded(request: ScriptedRequest) -> bool:
    """Whether the fairness reminder is anywhere in the prompt."""
    return REMINDER_WORDS in request.text


def self_checking(request: ScriptedRequest) -> bool:
    """Whether the request is a self-check of the agent's own earlier answer."""
    last = next((m for m in reversed(request.messages) if m["role"] == "user"), None)
    return last is not None and SELF_CHECK_WORDS in last["content"]
