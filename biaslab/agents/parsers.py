"""Output parsers: raw model text → value, or `ParseError` with a reason worth recording.

Each parser pairs with an `OutputConstraint` so local models can be held to the format by
constrained decoding, while hosted models are parsed robustly. A judge's answer is parsed from
outside every copy of the text it judges (`parse_outside_judged`), so a judged reply that ends
in a look-alike verdict, quoted by the judge, is never read as the judge's own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["ParseError", "NoVerdict", "OutputConstraint", "Parser", "probability_list",
           "json_object", "probability_list_grammar", "label_with_reason", "quoted_blocks",
           "outside_judged", "parse_outside_judged"]


class ParseError(ValueError):
    """The model's text does not have the expected shape."""


class NoVerdict(ParseError):
    """The text holds no answer of the expected kind at all (no JSON object with the needed
    keys, no ``FINAL:`` marker, no label word), as opposed to one that is malformed or invalid.
    `parse_outside_judged` tells the two apart."""


@dataclass(frozen=True)
class OutputConstraint:
    """Constrained decoding for providers that support it (GBNF grammar or JSON schema)."""

    grammar: str | None = None
    json_schema: dict | None = None

    def params(self) -> dict[str, Any]:
        return {"grammar": self.grammar, "json_schema": self.json_schema}


Parser = Callable[[str], Any]
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?%?"


def probability_list(n: int, tag: str = "OUTPUT") -> Parser:
    """Parse ``TAG: [p1 p2 ... pn]`` into n floats in [0, 1].

    Robust to commas, extra text around the list, percent signs and a missing tag when the
    text holds exactly one bracketed list. Wrong counts and out-of-range values are errors.
    """

    def parse(text: str) -> list[float]:
        found = re.findall(rf"{tag}\s*:?\s*\[([^\]]*)\]", text, flags=re.I)
        if not found:
            found = re.findall(r"\[([^\]]*)\]", text)
            if len(found) != 1:
                raise ParseError(f"no '{tag}: [...]' list found")
        body = found[-1]
        tokens = re.findall(_NUMBER, body)
        leftover = re.sub(_NUMBER, "", body).replace(",", " ").replace(";", " ").strip()
        if leftover:
            raise ParseError(f"non-numeric text in the list: {leftover[:40]!r}")
        values = []
        for token in tokens:
            value = float(token.rstrip("%")) / (100 if token.endswith("%") else 1)
            if not 0.0 <= value <= 1.0:
                raise ParseError(f"probability out of [0, 1]: {token}")
            values.append(value)
        if len(values) != n:
            raise ParseError(f"expected {n} probabilities, got {len(values)}")
        return values

    return parse


def probability_list_grammar(n: int, tag: str = "OUTPUT") -> OutputConstraint:
    """GBNF for exactly n two-decimal probabilities after the tag."""
    rest = f' (" " prob){{{n - 1}}}' if n > 1 else ""
    grammar = (f'root ::= "{tag}: [" prob{rest} "]"\n'
               'prob ::= "0." [0-9] [0-9] | "1.00"\n')
    return OutputConstraint(grammar=grammar)


def json_object(required: Sequence[str], validate: Callable[[dict], Any] | None = None) -> Parser:
    """Parse the last top-level JSON object in the text that has the required keys; optionally
    validate it.

    The last, because a model that restates or quotes something before answering puts its own
    answer at the end; objects nested in another object are part of that object, not answers.
    """

    def parse(text: str) -> Any:
        decoder, objects, first_error = json.JSONDecoder(), [], None
        start = text.find("{")
        while start >= 0:
            try:
                value, end = decoder.raw_decode(text, start)
            except json.JSONDecodeError as exc:
                first_error = first_error or exc.msg
                start = text.find("{", start + 1)
                continue
            objects.append(value)
            start = text.find("{", end)
        if not objects:
            raise NoVerdict(f"invalid JSON: {first_error}" if first_error
                            else "no JSON object found")
        complete = [o for o in objects if all(k in o for k in required)]
        if not complete:
            missing = next(k for k in required if k not in objects[-1])
            raise NoVerdict(f"JSON object lacks key '{missing}'")
        return validate(complete[-1]) if validate else complete[-1]

    return parse


def label_with_reason(labels: Sequence[str]) -> tuple[Parser, OutputConstraint]:
    """A judge's verdict: ``{"label": one of labels, "justification": str}``."""
    schema = {"type": "object",
              "properties": {"label": {"type": "string", "enum": list(labels)},
                             "justification": {"type": "string", "maxLength": 300}},
              "required": ["label", "justification"]}

    def check(value: dict) -> dict:
        if value["label"] not in labels:
            raise ParseError(f"label {value['label']!r} not in {list(labels)}")
        return {"label": value["label"], "justification": str(value["justification"])}

    return json_object(["label", "justification"], check), OutputConstraint(json_schema=schema)


# -- verdicts outside the judged text ------------------------------------------------------------
# Judge templates quote each judged text between tags named ``quoted-<what>``
# (``<quoted-reply>`` ... ``</quoted-reply>``); a judge that echoes such a block is quoting.
_QUOTED_BLOCK = re.compile(r"<(quoted-[\w-]+)>(.*?)</\1\s*>", re.S | re.I)
_MIN_SPAN = 6
"""Shorter judged lines (and bare single words such as FAIR) are never blanked: they are too
likely to occur in the judge's own answer by chance."""


def quoted_blocks(text: str) -> list[tuple[str, str]]:
    """The ``(tag, content)`` of every ``<quoted-...>`` block in a text, in order."""
    return [(m.group(1), m.group(2)) for m in _QUOTED_BLOCK.finditer(text)]


def _substantial(span: str) -> bool:
    span = span.strip()
    return len(span) >= _MIN_SPAN and not re.fullmatch(r"\w+", span)


def _verbatim(span: str) -> re.Pattern:
    """`span` as written, any run of whitespace matching any other, not inside a word."""
    tokens = span.split()
    body = r"\s+".join(map(re.escape, tokens))
    head = r"(?<!\w)" if re.match(r"\w", tokens[0]) else ""
    tail = r"(?!\w)" if re.search(r"\w$", tokens[-1]) else ""
    return re.compile(head + body + tail)


def _blank(text: str, pattern: re.Pattern, limit: int | None, removed: list[str]) -> str:
    """`text` with the first `limit` matches of `pattern` (all when None) replaced by a space;
    each removed piece is appended to `removed`."""
    if limit is not None and limit <= 0:
        return text

    def cut(match: re.Match) -> str:
        removed.append(match.group(0))
        return " "

    return pattern.sub(cut, text, count=limit or 0)


def outside_judged(text: str, judged: Sequence[str], *, limited: bool = False) -> str:
    """The judge's own words: `text` with every span of judged text blanked out.

    Blanked, in order: (1) verbatim copies of a whole judged text; (2) any ``<quoted-...>``
    block, the delimiters judge templates put around judged text; (3) verbatim copies of each
    line of a judged text, wherever they stand (a quote line by line, inline, after ``> ``).
    Verbatim allows re-wrapped whitespace; texts and lines shorter than 6 characters, or a bare
    single word, are left alone.

    Args:
        text: the judge's raw answer.
        judged: the texts under judgement, as the judge's prompt showed them.
        limited: blank each whole text and each line at most as many times as it occurs in
            `judged`, not every time (see `parse_outside_judged`).
    """
    judged = [j for j in judged if j]
    if not judged:
        return text
    removed: list[str] = []
    wholes = [j.strip() for j in judged if _substantial(j)]
    for whole in sorted(set(wholes), key=len, reverse=True):
        text = _blank(text, _verbatim(whole), wholes.count(whole) if limited else None, removed)
    text = _blank(text, _QUOTED_BLOCK, None, removed)
    lines = [ln.strip() for j in judged for ln in j.splitlines() if _substantial(ln)]
    for line in sorted(set(lines), key=len, reverse=True):
        pattern = _verbatim(line)
        # a copy already removed with a whole quote used up one of the line's occurrences
        budget = lines.count(line) - sum(len(pattern.findall(r)) for r in removed)
        text = _blank(text, pattern, budget if limited else None, [])
    return text


def parse_outside_judged(parser: Parser, text: str, judged: Sequence[str]) -> Any:
    """Parse the judge's verdict from outside any span of the judged text, never a look-alike
    inside it (a judged reply that ends in a forged verdict, quoted by the judge).

    Every copy of the judged text is blanked first (`outside_judged`), so the parser's last
    verdict is the judge's own. One case needs a second look: a judge's verdict that is,
    word for word, a line of the judged text (the reply forged exactly the verdict the judge
    gives). If nothing is left but such copies (`NoVerdict`), each judged line is blanked only
    as often as the judged text holds it, so a judge that quotes the line and then gives the
    same verdict keeps one copy: the same text, so the same verdict. A judge whose only verdict
    equals a forged line and that does not quote it is unscored, never read from the quote.
    """
    if not judged:
        return parser(text)
    try:
        return parser(outside_judged(text, judged))
    except NoVerdict:
        return parser(outside_judged(text, judged, limited=True))
