"""The verdict channel: where a judge's answer is read from, out of reach of the judged text.

A judge, validator or oracle (a call with judged texts, `biaslab.agents.ask`) is asked to write
its answer between two markers that are new for each prompt: ``<verdict-K>`` and
``</verdict-K>``, where ``K`` is an HMAC of the rendered prompt under the run's verdict key
(`biaslab.traces.verdict_key`). Only what stands between those markers is parsed; everything
else the judge writes (a quote of the judged reply, whole or in part, before or after its
verdict, as ``> `` lines, or restated in its own words) is never read.

Why this holds: the judged text was written before the judge's prompt existed, by a model that
never sees any judge prompt, and ``K`` depends on a key it never sees either, so no judged text
can hold the markers (a guess succeeds with probability 2⁻⁴⁸). A judge that copies the judged
text *between* its own markers, or that is persuaded by it, is not something parsing can undo:
see docs/reliability.md.

``K`` is a function of the prompt and the key only, so a resumed run, a replay and every shard
of a run (which inherit the run's key) render byte-identical prompts: the same cache keys, the
same recorded calls. Where constrained decoding holds the answer to its format (a local model
with a grammar or JSON schema), the whole output is the structured answer and no marker is
asked for.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from biaslab.agents.parsers import NoVerdict, ParseError, Parser, _brief, same_verdict

__all__ = ["VerdictMarker", "marker_for", "parse_marked", "requested_marker", "answer_in_marker",
           "VERDICT_PROMPT", "MARKER_TOKENS"]

VERDICT_PROMPT = "common/verdict"
"""The sentence appended to a judge's prompt that asks for the markers (slots open, close)."""
MARKER_TOKENS = 48
"""Output tokens added to a marked call's budget, for the two markers."""
_DIGITS = 12
_REQUEST = re.compile(r"(<verdict-[0-9a-f]{12}>) and (</verdict-[0-9a-f]{12}>)")


@dataclass(frozen=True)
class VerdictMarker:
    """One call's markers: ``<verdict-K>`` opens the answer, ``</verdict-K>`` closes it."""

    token: str

    @property
    def open(self) -> str:
        return f"<verdict-{self.token}>"

    @property
    def close(self) -> str:
        return f"</verdict-{self.token}>"

    def wrap(self, answer: str) -> str:
        return f"{self.open}{answer}{self.close}"


def marker_for(key: bytes, messages: Sequence[dict[str, str]]) -> VerdictMarker:
    """The markers of the call whose rendered prompt is `messages`: HMAC-SHA256 under `key`."""
    body = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)
    digest = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    return VerdictMarker(digest[:_DIGITS])


def parse_marked(parser: Parser, text: str, marker: VerdictMarker) -> Any:
    """Parse the judge's answer from between its markers, and from nowhere else.

    Each closed ``open … close`` span is a candidate, and the answer must be exactly one
    verdict: a span the parser finds no answer in (`NoVerdict`: the judge echoing the
    instruction's markers, say) is not one; a span that holds two verdicts (the parser's
    `ParseError`), or two spans with different verdicts, is a parse failure, re-asked like any
    other, never "the last one" (a judge that quotes the judged text between its own markers,
    or puts a second pair around a quoted claim, would have the quote read). Spans that
    restate one verdict agree and count once (`same_verdict`). No span: `NoVerdict`, naming
    the markers, so the re-ask says what was missing. An opening marker never closed is not an
    answer: what follows it may be a quote.
    """
    spans = re.findall(re.escape(marker.open) + r"(.*?)" + re.escape(marker.close), text, re.S)
    if not spans:
        raise NoVerdict(f"no answer between the markers {marker.open} and {marker.close}")
    values: list[Any] = []
    empty: NoVerdict | None = None
    for span in spans:
        try:
            values.append(parser(span))
        except NoVerdict as exc:
            empty = empty or exc
    if not values:
        raise empty  # type: ignore[misc]  (spans exist, so one raised)
    if any(not same_verdict(values[0], value) for value in values[1:]):
        raise ParseError(f"two different verdicts between the markers {marker.open} and "
                         f"{marker.close}: {', '.join(_brief(v) for v in values)}; give exactly one")
    return values[-1]


def requested_marker(prompt: str) -> VerdictMarker | None:
    """The markers a prompt asks for (as `VERDICT_PROMPT` words it), or None: what a scripted
    judge reads, as a real one would, to know where its answer goes."""
    found = _REQUEST.findall(prompt)
    return VerdictMarker(found[-1][0][len("<verdict-"):-1]) if found else None


def answer_in_marker(prompt: str, answer: str) -> str:
    """`answer` between the markers `prompt` asks for; unchanged when it asks for none or the
    answer already holds them (a scripted judge that places its markers itself)."""
    marker = requested_marker(prompt)
    if marker is None or marker.open in answer:
        return answer
    return marker.wrap(answer)
