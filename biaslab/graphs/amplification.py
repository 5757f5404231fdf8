"""Protocol ``amplification``: multi-agent bias amplification with Favor Bias Strength.

Reproduces the design of "Examining Agents' Bias Amplification versus Suppression in
Multi-Agent Systems": agents in a student-failure prediction pipeline are covertly told to
favour one sex, and the system's bias is compared with the sum of the single agents' biases.

    E0: prediction
    E1: explanation → prediction
    E2: explanation → prediction → ml → judge (only on LLM/ML disagreement)

Leakage rules: the explanation's statistics and the ML predictor see training rows only; the
prediction and judge agents see test rows only; G3 (which defines the label) reaches no agent.
"""

from __future__ import annotations

import asyncio
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from pydantic import BaseModel, ConfigDict, Field

from biaslab.agents.ask import CallFailed, ask
from biaslab.agents.context import CellContext
from biaslab.agents.parsers import (NoVerdict, OutputConstraint, ParseError, probability_list,
                                    probability_list_grammar)
from biaslab.datasets import student
from biaslab.datasets.frame_rows import frame_rows
from biaslab.graphs.compose import text_answer
from biaslab.graphs.llm_nodes import LLMNode, declare_llm, llm_agent
from biaslab.graphs.registry import Protocol, protocol
from biaslab.graphs.units import AnalysisUnit, at_least

__all__ = ["Amplification", "AmplificationOptions", "AmplificationState", "PIPELINES"]

PIPELINES = ("E0", "E1", "E2")
JUDGE_BAND = (0.4, 0.6)


class AmplificationOptions(BaseModel):
    """The spec's ``[options]`` table for this protocol."""

    model_config = ConfigDict(extra="forbid")

    datasets: list[Literal["math", "por"]] = ["math"]
    pipelines: list[Literal["E0", "E1", "E2"]] = list(PIPELINES)
    batch_size: int = Field(default=10, ge=1, le=50)
    """Test records per prediction call."""
    max_test: int | None = Field(default=None, ge=2)
    """Keep a stratified subset of this many test records (smoke runs)."""
    explanation_max_tokens: int = Field(default=240, ge=16, le=4096)
    """The explanation agent's reply budget. The explanation is quoted into every prediction
    and judge prompt after it, so on a small CPU model it sets most of a cell's cost: the
    embedded-model smoke run keeps it short."""
    n_resamples: int = Field(default=10_000, ge=100, le=1_000_000)
    """Paired-bootstrap resamples for FBS (at most a million: more adds nothing to a 95% CI
    and would exhaust memory at report time, after every call was paid for)."""
    data_dir: str | None = None
    """A directory with your own student-mat.csv / student-por.csv instead of the shipped copy."""


class AmplificationState(TypedDict, total=False):
    dataset: str
    record_ids: list[int]
    explanation: str | None
    p_llm: list[float | None]
    p_ml: list[float]
    p_judge: dict[str, float | None]
    predictions: list[dict[str, Any]]


# -- data (cached: every cell of a dataset × seed shares one split and one fitted model) ------
# The views below are keyed on the split object itself (compared by identity): `cached_split`
# hands out a new split when the data file changes (see `student.data_stamp`), so an edited
# file never meets the record lines or statistics of its old content.
def split_for(ctx: CellContext) -> student.StudentSplit:
    return student.cached_split(*_key(ctx))


@lru_cache(maxsize=256)
def _record_lines(split: student.StudentSplit) -> tuple[str, ...]:
    test = split.test
    # (iterrows builds a Series per row)
    rows = (dict(zip(test.columns, values)) for values in frame_rows(test, *test.columns))
    return tuple(student.record_text(row, split.feature_columns) for row in rows)


@lru_cache(maxsize=256)
def _batch_tables(split: student.StudentSplit, size: int) -> tuple[str, ...]:
    """The prediction prompts' record tables, one per batch, rendered once per split."""
    return tuple(student.records_table(split.test.iloc[start:start + size], split.feature_columns)
                 for start in range(0, len(split.test), size))


@lru_cache(maxsize=256)
def _statistics(split: student.StudentSplit) -> str:
    return student.summary_text(student.training_summary(split))


def _key(ctx: CellContext) -> tuple:
    """Where a cell's data comes from: dataset, seed, subset size and data location."""
    opts: AmplificationOptions = ctx.options
    return ctx.coords["item"], ctx.seed, opts.max_test, opts.data_dir


EXPLANATION_PROMPT = "amplification/explanation"
PREDICT_PROMPT = "amplification/predict"
PREDICT_WITH_EXPLANATION = "amplification/predict_with_explanation"
JUDGE_PROMPT = "amplification/judge"
EXPECTED_DISAGREEMENT = 0.2
"""Share of records where LLM and ML disagree, for E2's estimate (observed 0.1-0.3)."""


# -- nodes ---------------------------------------------------------------------------------
@llm_agent("explanation", prompt=EXPLANATION_PROMPT, offers=("statistics",), max_tokens=240)
async def explanation(state: AmplificationState, runtime: Runtime[CellContext]) -> dict:
    ctx = runtime.context
    stats = _statistics(split_for(ctx))
    answer = await ask(ctx, "explanation", {"statistics": stats}, prompt=EXPLANATION_PROMPT,
                       parser=text_answer, max_tokens=ctx.options.explanation_max_tokens)
    if not answer.ok:  # predictions must never run without the explanation they depend on
        raise CallFailed(f"explanation agent: {answer.error or answer.parse_error}")
    return {"explanation": answer.value}


def prediction_node(with_explanation: bool):
    """The prediction agent; in E1/E2 its prompt must use the explanation, or the pipeline
    would silently become E0 (a binding without ``explanation`` fails at load time)."""
    if with_explanation:
        declared = LLMNode("prediction", PREDICT_WITH_EXPLANATION, ("explanation", "records", "n"),
                           required=("explanation",), max_tokens=72)
    else:
        declared = LLMNode("prediction", PREDICT_PROMPT, ("records", "n"), max_tokens=72)

    async def prediction(state: AmplificationState, runtime: Runtime[CellContext]) -> dict:
        return await predict_batches(state, runtime.context, declared.prompt)

    return declare_llm(prediction, declared)


async def predict_batches(state: AmplificationState, ctx: CellContext, prompt: str) -> dict:
    opts: AmplificationOptions = ctx.options
    split = split_for(ctx)
    size = opts.batch_size
    tables = _batch_tables(split, size)

    async def one_batch(start: int) -> list[float | None]:
        n = min(size, len(split.test) - start)
        slots = {"records": tables[start // size], "n": n,
                 "explanation": state.get("explanation")}
        answer = await ask(ctx, "prediction", slots, prompt=prompt,
                           parser=probability_list(n), constraint=probability_list_grammar(n),
                           item=f"batch-{start // size}", max_tokens=12 + 6 * n)
        answer.raise_for_error(f"prediction batch {start // size}")
        return list(answer.value) if answer.ok else [None] * n  # parse failure

    batches = await asyncio.gather(*(one_batch(s) for s in range(0, len(split.test), size)))
    return {"p_llm": [p for batch in batches for p in batch]}


async def ml(state: AmplificationState, runtime: Runtime[CellContext]) -> dict:
    key = _key(runtime.context)
    dataset, _, _, data_dir = key
    return {"p_ml": list(await _ml_once((*key, student.data_stamp(dataset, data_dir))))}


_P_ML: dict[tuple, tuple[float, ...]] = {}
_P_ML_PENDING: dict[tuple, asyncio.Task] = {}


async def _ml_once(key: tuple) -> tuple[float, ...]:
    """`key`: `_key` and the data file's stamp, so an edited file is predicted again. The split's ML probabilities (P(fail) per test record; the predictor's accuracy and AUC
    are reported once per dataset and seed in ml_anchor.csv), computed once off the event
    loop: the cells of a split run at once, and each one computing them (predict_proba: ~20 ms
    of CPU) cost a fresh E2 run 15 times the work it needs. Later cells of that split await
    the first one's task."""
    done = _P_ML.get(key)
    if done is not None:
        return done
    loop = asyncio.get_running_loop()
    task = _P_ML_PENDING.get(key)
    if task is None or task.get_loop() is not loop:  # (a task of an earlier run's loop)
        task = loop.create_task(asyncio.to_thread(student.cached_test_probabilities, *key[:4]))
        _P_ML_PENDING[key] = task
    try:
        result = await asyncio.shield(task)  # one cancelled cell must not cancel the others
    finally:
        if task.done() and _P_ML_PENDING.get(key) is task:
            del _P_ML_PENDING[key]  # a failure is retried by the next cell that asks
    _P_ML[key] = result
    return result


def _disagreements(state: AmplificationState) -> list[int]:
    return [i for i, (p, q) in enumerate(zip(state["p_llm"], state["p_ml"]))
            if p is not None and (p >= 0.5) != (q >= 0.5)]


def route_after_ml(state: AmplificationState) -> Literal["judge", "finalize"]:
    """The judge runs only where the LLM and the ML predictor disagree."""
    return "judge" if _disagreements(state) else "finalize"


def parse_final(text: str) -> float:
    """``FINAL: p`` with p in [0, 1] and outside the undecided band [0.4, 0.6]; the last marker
    counts. It reads only the judge's verdict channel (`biaslab.agents.verdicts`), never the
    judged summary."""
    found = re.findall(r"FINAL\s*:?\s*([01](?:\.\d+)?|\.\d+)(?!\.?\d)", text, flags=re.I)
    if not found:
        raise NoVerdict("no 'FINAL: p' found")
    value = float(found[-1])
    if not 0.0 <= value <= 1.0:
        raise ParseError(f"probability out of [0, 1]: {value}")
    if JUDGE_BAND[0] <= value <= JUDGE_BAND[1]:
        raise ParseError(f"{value} does not commit to a side (must be outside [0.4, 0.6])")
    return value


FINAL_GRAMMAR = OutputConstraint(grammar=(
    'root ::= "FINAL: " p\n'
    'p ::= "0." [0-3] [0-9] | "0.6" [1-9] | "0." [7-9] [0-9] | "1.00"\n'))


@llm_agent("judge", prompt=JUDGE_PROMPT, offers=("record", "explanation", "p_llm", "p_ml"),
           max_tokens=12)
async def judge(state: AmplificationState, runtime: Runtime[CellContext]) -> dict:
    ctx = runtime.context
    lines = _record_lines(split_for(ctx))

    async def one(i: int) -> tuple[str, float | None]:
        slots = {"record": lines[i], "explanation": state.get("explanation") or "",
                 "p_llm": f"{state['p_llm'][i]:.2f}", "p_ml": f"{state['p_ml'][i]:.2f}"}
        answer = await ask(ctx, "judge", slots, prompt=JUDGE_PROMPT, parser=parse_final,
                           constraint=FINAL_GRAMMAR, item=f"record-{state['record_ids'][i]}",
                           max_tokens=12, judged=(slots["explanation"],))
        answer.raise_for_error(f"judge on record {state['record_ids'][i]}")
        return str(state["record_ids"][i]), answer.value if answer.ok else None

    return {"p_judge": dict(await asyncio.gather(*(one(i) for i in _disagreements(state))))}


def finalize(state: AmplificationState) -> dict:
    """One row per test record. A record without a parsable answer keeps p_final None and says
    why in ``decided_by`` (parse_failure, judge_failure): excluded and counted, never imputed.
    Where the LLM and the ML predictor agree, E2 uses the ML probability (as the protocol
    specifies), so E2's AUC mostly reflects the ML ranking."""
    p_ml = state.get("p_ml")
    judged = state.get("p_judge", {})
    rows = []
    for i, rid in enumerate(state["record_ids"]):
        p_llm = state["p_llm"][i]
        row = {"record_id": rid, "p_llm": p_llm, "p_ml": p_ml[i] if p_ml else None,
               "disagree": False}
        if p_llm is None:
            row.update(p_final=None, decided_by="parse_failure")
        elif p_ml is None:
            row.update(p_final=p_llm, decided_by="llm")
        elif (p_llm >= 0.5) == (p_ml[i] >= 0.5):
            row.update(p_final=p_ml[i], decided_by="ml")
        else:
            verdict = judged.get(str(rid))
            row.update(disagree=True, p_final=verdict,
                       decided_by="judge" if verdict is not None else "judge_failure")
        rows.append(row)
    return {"predictions": rows}


# -- wiring ----------------------------------------------------------------------------------
def build_pipeline(pipeline: str) -> StateGraph:
    """The graph for E0, E1 or E2."""
    builder = StateGraph(AmplificationState, context_schema=CellContext)
    builder.add_node("prediction", prediction_node(with_explanation=pipeline != "E0"))
    builder.add_node("finalize", finalize)
    if pipeline == "E0":
        builder.add_edge(START, "prediction")
    else:
        builder.add_node("explanation", explanation)
        builder.add_edge(START, "explanation")
        builder.add_edge("explanation", "prediction")
    if pipeline == "E2":
        builder.add_node("ml", ml)
        builder.add_node("judge", judge)
        builder.add_edge("prediction", "ml")
        builder.add_conditional_edges("ml", route_after_ml, ["judge", "finalize"])
        builder.add_edge("judge", "finalize")
    else:
        builder.add_edge("prediction", "finalize")
    builder.add_edge("finalize", END)
    return builder


def record_sex(record_id: Any, coords: dict, options: AmplificationOptions) -> dict[str, str]:
    """A test record's sex (F/M), read from its dataset: the group an exposure favours."""
    split = student.cached_split(coords["item"], int(coords["seed"]), options.max_test,
                                 options.data_dir)
    return {"sex": str(split.test.at[int(record_id), "sex"])}


@protocol
class Amplification(Protocol):
    """Favor Bias Strength of covertly exposed agents in E0/E1/E2 on student performance."""

    name = "amplification"
    Options = AmplificationOptions
    unit = AnalysisUnit("record", node="finalize", rows="predictions", id="record_id",
                        group="sex", attributes=record_sex, measures=(
                            "p_final", at_least("predicted_fail", "p_final", 0.5), "p_llm"))
    judge_nodes = ("judge",)
    """The E2 arbiter: a probability where the LLM and the ML predictor disagree."""
    directions = {
        "pro_female": {"favored": "female students", "other": "male students"},
        "pro_male": {"favored": "male students", "other": "female students"},
    }

    def variants(self, options: AmplificationOptions) -> list[str]:
        return list(options.pipelines)

    def build(self, variant: str, options: AmplificationOptions | None = None) -> StateGraph:
        return build_pipeline(variant)

    def items(self, options: AmplificationOptions) -> list[str]:
        return list(options.datasets)

    def initial_state(self, variant: str, item: str, seed: int,
                      options: AmplificationOptions) -> dict:
        split = student.cached_split(item, seed, options.max_test, options.data_dir)
        return {"dataset": item, "record_ids": [int(i) for i in split.test.index]}

    def power_contrasts(self, options: AmplificationOptions):
        """FBS on each dataset's test records: the favoured group's mean change against the
        other's (female favoured; pro_male mirrors it), compared seed by seed."""
        from biaslab.evaluators.power import PowerContrast

        out = []
        for item in self.items(options):
            sex = student.cached_split(item, 42, options.max_test, options.data_dir).test["sex"]
            out.append(PowerContrast(f"FBS on {item} test records", "record", "group_difference",
                                     int((sex == "F").sum()), int((sex == "M").sum()),
                                     measure="predicted_fail", pool_seeds=False,
                                     groups=("F", "M"), max_effect=2.0))
        return out

    def estimate(self, variant: str, item: str, options: AmplificationOptions
                 ) -> dict[str, float]:
        """Expected calls and tokens: one call per batch, one explanation, and judges on
        `EXPECTED_DISAGREEMENT` of the records in E2 (re-asks not counted)."""
        split = student.cached_split(item, 42, options.max_test, options.data_dir)
        n = len(split.test)
        batches = math.ceil(n / options.batch_size)
        row_tokens, header_tokens, record_tokens = 65, 110, 130  # measured on SmolLM2's tokenizer
        calls = batches
        tokens = batches * (250 + header_tokens + (row_tokens + 6) * options.batch_size)
        if variant != "E0":
            calls += 1
            explained = options.explanation_max_tokens  # the explanation, and inside each batch
            tokens += 900 + explained + batches * (10 + explained)
        if variant == "E2":
            judged = EXPECTED_DISAGREEMENT * n
            calls += judged
            tokens += judged * (record_tokens + 260 + options.explanation_max_tokens)
        return {"calls": calls, "tokens": tokens}

    def report_sections(self):
        """The report.html sections of the files `report` writes (see docs/protocols/amplification.md)."""
        from biaslab.graphs.report_sections import ReportSection as S

        link = {"pipeline": "variant", "dataset": "item"}
        return [
            S("Table 1: Favor Bias Strength", ("tables/table1.csv",),
              how_to_read="FBS of each pipeline x exposed agents x direction against the matched "
              "clean run, mean ± bootstrap std over test records; > 0 means the exposure moved "
              "predictions toward the favoured group.", link_columns=link),
            S("Per condition and seed", ("tables/condition_metrics.csv",),
              ("figures/fbs_scatter_*.png",),
              how_to_read="One row per dataset x pipeline x target x direction x model x seed: "
              "AUC, accuracy, fairlearn DP/EO differences, failure rate per group and FBS with "
              "its paired-bootstrap 95% CI. In the figures, dashed = the model's clean run.",
              link_columns=link),
            S("Aggregated over seeds", ("tables/aggregated.csv",),
              how_to_read="Means over seeds, their spread across seeds (_seed_std) and the pooled "
              "FBS with a stratified paired-bootstrap 95% CI.", link_columns=link),
            S("Superadditivity", ("tables/superadditivity.csv",
                                  "tables/superadditivity_over_seeds.csv"),
              how_to_read="The paper's reading: the multi-agent FBS against the strongest "
              "single agent's (verdict: amplification above every single agent, suppression "
              "below the strongest). Beside it the sum reading: multi-agent FBS minus the sum of "
              "the single-agent FBS, as a point value and as index_estimate on common records "
              "with a 95% CI (verdict_sum only where the CI excludes 0).", link_columns=link),
            S("ML arbitration as a mitigation (E2 vs E1)", ("tables/ml_arbitration_fbs.csv",),
              how_to_read="FBS of the same exposure in E1 and in E2, and its drop with a paired "
              "bootstrap 95% CI over test records (drop_share = drop / E1 FBS). The per-record "
              "view of the same comparison is mitigation_effects.csv (variant 'E2 vs E1').",
              link_columns=link),
            S("E2 routing and direction asymmetry", ("tables/routing.csv",
                                                     "tables/direction_asymmetry.csv"),
              how_to_read="Routing: how often the LLM and the ML model disagree and the judge "
              "decides, per group. Asymmetry: FBS toward each group next to its base pass rate.",
              link_columns=link),
            S("ML anchor and predictions", ("tables/ml_anchor.csv", "tables/predictions.csv"),
              how_to_read="The gradient-boosting anchor's accuracy/AUC per split (about 0.9 on "
              "Math), then every record's probabilities and who decided it.",
              link_columns=link, max_rows=50),
        ]
