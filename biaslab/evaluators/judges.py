"""LLM judges, judge ensembles (k judges × r repeats, majority vote) and rule oracles.

A judge returns a label from a fixed set plus a justification. A verdict that cannot be parsed
after one re-ask is *unscored* (label None): it is recorded and left out of the vote, never
guessed. A judge call that fails for good (after its retries) is not a verdict: it fails the
cell (`CallFailed`), which ``--resume`` retries. An ensemble reports ties instead of breaking them.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from biaslab.agents.ask import ask
from biaslab.agents.context import CellContext
from biaslab.agents.parsers import label_with_reason
from biaslab.agents.providers import ModelSpec
from biaslab.evaluators.votes import majority_vote

__all__ = ["Verdict", "EnsembleVerdict", "judge", "judge_ensemble", "judge_node",
           "regex_oracle"]


@dataclass(frozen=True)
class Verdict:
    """One judge's answer for one repeat."""

    judge: str
    sample: int
    label: str | None
    justification: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class EnsembleVerdict:
    """The vote of k judges × r repeats.

    Attributes:
        label: the majority label; None on a tie or when nothing was scored.
        tie: whether the top labels tied.
        counts: votes per label.
        unscored: verdicts that could not be parsed or whose call failed.
        verdicts: every individual verdict, judge-major then repeat.
    """

    label: str | None
    tie: bool
    counts: dict[str, int]
    unscored: int
    verdicts: tuple[Verdict, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "tie": self.tie, "counts": self.counts,
                "unscored": self.unscored,
                "verdicts": [v.__dict__ for v in self.verdicts]}


async def judge(ctx: CellContext, node: str, slots: Mapping[str, Any], *, prompt: str,
                labels: Sequence[str], item: str = "", sample: int = 0,
                model: ModelSpec | None = None, judged: Sequence[str] = ()) -> Verdict:
    """One LLM verdict: ``{"label": one of labels, "justification": ...}``.

    `judged` are the texts under judgement (e.g. the answer a slot carries). Whatever they
    are, the verdict is read only from the judge's verdict channel, never from a look-alike
    verdict inside them (`biaslab.agents.verdicts`)."""
    parser, constraint = label_with_reason(labels)
    answer = await ask(ctx, node, slots, prompt=prompt, parser=parser, constraint=constraint,
                       item=item, sample=sample, model=model, max_tokens=160, judged=judged,
                       verdict=True)
    name = (model or ctx.bindings.model_for(node)).label
    answer.raise_for_error(f"judge '{node}' ({name})")  # a failed call fails the cell
    if not answer.ok:
        return Verdict(name, sample, None, error=answer.error or answer.parse_error)
    return Verdict(name, sample, answer.value["label"], answer.value["justification"])


async def judge_ensemble(ctx: CellContext, node: str, slots: Mapping[str, Any], *, prompt: str,
                         labels: Sequence[str], judges: Sequence[ModelSpec] | None = None,
                         repeats: int = 1, item: str = "",
                         judged: Sequence[str] = ()) -> EnsembleVerdict:
    """k judges (default: the node's bound model alone) × `repeats` samples, majority vote;
    `judged` as in `judge`."""
    models = list(judges) if judges else [ctx.bindings.model_for(node)]
    # A model listed twice is two members: its second copy's repeats continue its sample
    # numbers (so their seeds and cache keys), never a replay of the first copy's answers.
    copies = [models[:i].count(m) for i, m in enumerate(models)]
    verdicts = await asyncio.gather(*(
        judge(ctx, node, slots, prompt=prompt, labels=labels, item=item,
              sample=copy * repeats + r, model=m, judged=judged)
        for m, copy in zip(models, copies) for r in range(repeats)))
    vote = majority_vote([v.label for v in verdicts])
    return EnsembleVerdict(vote.label, vote.tie, dict(vote.counts), vote.unscored,
                           tuple(verdicts))


def judge_node(name: str, *, prompt: str, labels: Sequence[str],
               slots: Callable[[Mapping], Mapping[str, Any]], writes: str,
               judges: Sequence[ModelSpec] | None = None, repeats: int = 1,
               item: Callable[[Mapping], str] | None = None,
               judged: Callable[[Mapping], Sequence[str]] | None = None):
    """A graph node that runs a judge ensemble and writes its `EnsembleVerdict` as a dict.

    `judged` maps the state to the texts under judgement (default: every slot value the
    judge sees); the verdict is read from the judge's verdict channel only."""

    async def node(state: Mapping, runtime) -> dict:
        offered = slots(state)
        texts = judged(state) if judged else [v for v in offered.values() if isinstance(v, str)]
        verdict = await judge_ensemble(runtime.context, name, offered, prompt=prompt,
                                       labels=labels, judges=judges, repeats=repeats,
                                       item=item(state) if item else "", judged=texts)
        return {writes: verdict.as_dict()}

    node.__name__ = name
    return node


def regex_oracle(rules: Sequence[tuple[str, str]], default: str | None = None
                 ) -> Callable[[str], str | None]:
    """A rule oracle: the label of the first pattern found in the text (case-insensitive),
    else `default` (None = unscored)."""
    compiled = [(re.compile(p, re.I), label) for p, label in rules]

    def oracle(text: str) -> str | None:
        for pattern, label in compiled:
            if pattern.search(text):
                return label
        return default

    return oracle
