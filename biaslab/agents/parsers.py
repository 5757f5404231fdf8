"""Output parsers: raw model text → value, or `ParseError` with a reason worth recording.

Each parser pairs with an `OutputConstraint` so local models can be held to the format by
constrained decoding, while hosted models are parsed robustly. A judge's parser runs only on
its verdict channel (`biaslab.agents.verdicts`), never on text a judged reply could reach.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["ParseError", "NoVerdict", "OutputConstraint", "Parser", "probability_list",
           "json_object", "probability_list_grammar", "label_with_reason", "quoted_blocks",
           "same_verdict"]


class ParseError(ValueError):
    """The model's text does not have the expected shape."""


class NoVerdict(ParseError):
    """The text holds no answer of the expected kind at all (no JSON object with the needed
    keys, no ``FINAL:`` marker, no label word), as opposed to one that is malformed or
    invalid."""


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
    """Parse the one top-level JSON object in the text that has the required keys; optionally
    validate it.

    Exactly one answer: several such objects are accepted only when they are the same verdict
    (`same_verdict`: a model that restates its answer); two that differ are a `ParseError`,
    never "the last one", since a judge that quotes a judged text holding a forged
    ``{"label": "no"}`` after its own verdict would otherwise have the forgery read. Objects
    nested in another object are part of that object, not answers.
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
        complete = [o for o in objects if isinstance(o, dict) and all(k in o for k in required)]
        if not complete:
            last = objects[-1] if isinstance(objects[-1], dict) else {}
            missing = next(k for k in required if k not in last)
            raise NoVerdict(f"JSON object lacks key '{missing}'")
        values = [validate(o) for o in complete] if validate else complete
        if any(not same_verdict(values[0], v) for v in values[1:]):
            raise ParseError(f"{len(values)} different answers in one text "
                             f"({', '.join(_brief(v) for v in values)}); give exactly one")
        return values[-1]

    return parse


def same_verdict(one: Any, other: Any) -> bool:
    """Whether two parsed answers are the same verdict: a judge's ``label`` decides (a restated
    verdict may word its justification differently); any other value is compared whole."""
    if isinstance(one, dict) and isinstance(other, dict) and "label" in one and "label" in other:
        return one["label"] == other["label"]
    return one == other


def _brief(value: Any) -> str:
    """An answer as a parse error names it: a judge's label, else the value, cut short."""
    shown = value["label"] if isinstance(value, dict) and "label" in value else value
    return repr(shown)[:60]


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


# -- the judged texts in a judge's prompt ------------------------------------------------------
# Judge templates quote each judged text between tags named ``quoted-<what>``
# (``<quoted-reply>`` ... ``</quoted-reply>``), its value escaped so it cannot close the block
# (`biaslab.prompts.registry.escape_quoted`).
_QUOTED_BLOCK = re.compile(r"<(quoted-[\w-]+)>(.*?)</\1\s*>", re.S | re.I)


def quoted_blocks(text: str) -> list[tuple[str, str]]:
    """The ``(tag, content)`` of every ``<quoted-...>`` block in a text, in order: what a
    scripted judge reads of its prompt, the whole judged text as the prompt shows it."""
    return [(m.group(1), m.group(2)) for m in _QUOTED_BLOCK.finditer(text)]
