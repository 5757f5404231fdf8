"""A model that answers from a sheet of answers already recorded (``scripted:answer-sheet@FILE``).

Judge sensitivity (``biaslab replay RUN --mode rescore --sensitivity``) re-runs a protocol's
graph with its judge nodes bound to this model, so the protocol's own nodes and reports turn
a different choice of recorded judge votes into every table, without a new model call. The
sheet says, for each request a judge node will make (its messages and seed, as the source run
recorded them), which recorded answer to give, or that this judge gives none in this
configuration: then it answers `WITHHELD`, which no verdict parser reads, so the node records
an unscored vote exactly as for a judge whose answer could not be parsed. The node's re-ask
after that is answered `WITHHELD` again.

The sheet is a JSON list of ``{"messages": [...], "seed": int, "raw": str | null}``. A request
the sheet does not hold is an error (HTTP 400): the configuration would need a call nobody made.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from biaslab.agents.providers.scripted import ScriptedChatModel, ScriptedRequest
from biaslab.errors import ModelCallError, UserError

__all__ = ["ANSWER_SHEET", "WITHHELD", "answer_sheet_model", "write_answer_sheet",
           "request_key", "is_answer_sheet"]

ANSWER_SHEET = "answer-sheet"
"""The scripted name: ``scripted:answer-sheet@<path of the sheet>``."""
WITHHELD = "[withheld]"
"""The answer of a judge that has no vote in a configuration (read by no verdict parser)."""


def request_key(messages: Sequence[Mapping[str, str]], seed: Any) -> str:
    """What identifies one judge request on a sheet: its messages and its call seed (the seed
    names the node and the repeat, `biaslab.agents.ask.call_seed`)."""
    body = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)
    return hashlib.sha256(f"{seed}\n{body}".encode()).hexdigest()


def write_answer_sheet(path: str | Path, entries: Iterable[tuple[Sequence[Mapping[str, str]],
                                                                  int, str | None]]) -> Path:
    """Write a sheet of (messages, seed, raw answer or None for withheld) entries."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"messages": [dict(m) for m in messages], "seed": seed, "raw": raw}
            for messages, seed, raw in entries]
    path.write_text(json.dumps(rows, ensure_ascii=False))
    return path


@lru_cache(maxsize=32)
def _sheet(path: str, mtime_ns: int) -> dict[str, str | None]:
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"answer sheet {path}: cannot read it ({exc})") from None
    return {request_key(r["messages"], r["seed"]): r["raw"] for r in rows}


def answer_sheet_model(path: str) -> ScriptedChatModel:
    """The model for ``scripted:answer-sheet@<path>``."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"scripted model '{ANSWER_SHEET}': no answer sheet at {path}")
    answers = _sheet(str(file.resolve()), file.stat().st_mtime_ns)

    def respond(request: ScriptedRequest) -> str:
        messages = list(request.messages)
        # A re-ask after a withheld answer: the original request, then our answer, then the
        # re-ask prompt. It is withheld again.
        if (len(messages) >= 3 and messages[-2].get("role") == "assistant"
                and messages[-2].get("content") == WITHHELD):
            return WITHHELD
        key = request_key(messages, request.kwargs.get("seed"))
        if key not in answers:
            raise ModelCallError(f"answer sheet {path}: no recorded answer for this request "
                                 "(the configuration needs a call the source never made)",
                                 status=400)
        raw = answers[key]
        return WITHHELD if raw is None else raw

    return ScriptedChatModel(name_=f"{ANSWER_SHEET}@{file.name}", rules=[], default=respond,
                             answers_in_markers=False)  # recorded answers hold theirs


def is_answer_sheet(provider: str, model: str) -> bool:
    """Whether a model spec names an answer sheet: its answers are recorded ones, so a strict
    replay may use it (it never reaches a real model)."""
    return provider == "scripted" and model.startswith(f"{ANSWER_SHEET}@")
