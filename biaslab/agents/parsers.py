"""Output parsers: raw model text → value, or `ParseError` with a reason worth recording.

Each parser pairs with an `OutputConstraint` so local models can be held to the format by
constrained decoding, while hosted models are parsed robustly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["ParseError", "OutputConstraint", "Parser", "probability_list", "json_object",
           "probability_list_grammar", "label_with_reason"]


class ParseError(ValueError):
    """The model's text does not have the expected shape."""


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
    """Parse the first JSON object in the text; check required keys; optionally validate."""

    def parse(text: str) -> Any:
        start = text.find("{")
        if start < 0:
            raise ParseError("no JSON object found")
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start:])
        except json.JSONDecodeError as exc:
            raise ParseError(f"invalid JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            raise ParseError("JSON value is not an object")
        missing = [k for k in required if k not in value]
        if missing:
            raise ParseError(f"JSON object lacks key '{missing[0]}'")
        return validate(value) if validate else value

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
