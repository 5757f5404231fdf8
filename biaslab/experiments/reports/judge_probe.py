"""The judge-bias probe's tables: a run's verdicts against the same judges' verdicts on the
same inputs with the group terms swapped (``biaslab replay --mode counterfactual --node judge
--swap-groups``).

``tables/judge_bias_probe.csv``: per judge node, judge model and group of the protocol's unit
(``all`` pools them), the judged inputs, how many verdicts flipped in each direction, the
flip rate with its Wilson interval and, for a two-valued verdict, McNemar's exact test
(`biaslab.evaluators.judge_bias.verdict_flips`). ``tables/judge_bias_probe_measures.csv``:
the protocol's unit measures, run against probe (``compare_measures.csv``'s rows): how much
the headline numbers move when only the judges' inputs name the other group.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from biaslab.evaluators.judge_bias import FLIP_COLUMNS, verdict_flips, verdict_label
from biaslab.experiments.reports.html import write_html_report
from biaslab.experiments.reports.units import ALL_GROUPS, unit_frame
from biaslab.prompts.exposure import condition_id
from biaslab.prompts.group_swap import Lexicon
from biaslab.traces.store import RunStore

if TYPE_CHECKING:
    from biaslab.experiments.plan import Plan

__all__ = ["write_judge_probe", "probe_pairs", "PROBE_FILE", "PROBE_MEASURES_FILE",
           "PROBE_COLUMNS"]

PROBE_FILE = "judge_bias_probe.csv"
PROBE_MEASURES_FILE = "judge_bias_probe_measures.csv"
_BY = ["node", "judge_model", "group"]
PROBE_COLUMNS = [*_BY, "lexicon", "n_inputs", "n_inputs_swapped", *FLIP_COLUMNS]
_KEY = ["cell_id", "node", "item", "sample"]


def _lean(text: str, lexicon: Lexicon) -> int:
    """Side-1 terms minus side-2 terms in `text` (a term's side: its place in the first pair
    that lists it, so ``his`` is side 1 of ``[his, her]``)."""
    side: dict[str, int] = {}
    for a, b in lexicon.pairs:
        side.setdefault(a.lower(), 1)
        side.setdefault(b.lower(), 2)
    out = 0
    for found in lexicon.terms_in(text):
        out += {1: 1, 2: -1}.get(side.get(found, 0), 0)
    return out


def _verdicts(store: RunStore, nodes: frozenset[str], lexicon: Lexicon) -> pd.DataFrame:
    """Each judged input's final verdict (the last attempt of each call, so a re-asked call
    counts once), with how many group terms its input had swapped and its lean (`_lean`)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for record in store.iter_calls():
        if record.node not in nodes:
            continue
        ok = record.error is None and record.parse_error is None
        text = "\n".join(str(m.get("content", "")) for m in record.messages or ())
        rows[(record.cell_id, record.node, record.item, record.sample)] = {
            "verdict": verdict_label(record.parsed) if ok else None,
            "judge_model": record.model.get("alias") or
            f"{record.model.get('provider', '')}:{record.model.get('model', '')}",
            "swapped_terms": record.swapped_terms, "lexicon": record.group_swap,
            "lean": _lean(text, lexicon)}
    return pd.DataFrame([dict(zip(_KEY, k), **v) for k, v in rows.items()],
                        columns=[*_KEY, "verdict", "judge_model", "swapped_terms", "lexicon",
                                 "lean"])


def _unit_groups(store: RunStore, plan: "Plan") -> dict[str, dict[str, str]]:
    """cell id → unit id → the unit's group, from the protocol's analysis unit."""
    units = unit_frame(store, plan.protocol, plan.options)
    cells = store.cells()
    if units.empty or cells.empty or "condition" not in units:
        return {}
    mitigation = cells["mitigation"] if "mitigation" in cells else [None] * len(cells)
    ids = {(r.variant, str(r.item), condition_id(r.target, r.direction, m), r.model,
            int(r.seed)): r.cell_id
           for r, m in zip(cells.itertuples(), mitigation)}
    out: dict[str, dict[str, str]] = {}
    for r in units.drop_duplicates(["variant", "item", "condition", "model", "seed", "unit",
                                    "group"]).itertuples():
        cell = ids.get((r.variant, str(r.item), r.condition, r.model, int(r.seed)))
        if cell is not None and r.group not in ("", ALL_GROUPS):
            out.setdefault(cell, {})[str(r.unit)] = str(r.group)
    return out


def _group_of(item: str, units: dict[str, str]) -> str:
    """The group of the unit a judge call belongs to: the unit named by the call's item
    (``q12#0`` → ``q12``, ``record-7`` → ``7``), else the cell's one group when all its units
    share it (a dialogue's judge calls are all about its one seed); else none."""
    for candidate in (item, item.partition("#")[0], item.rpartition("-")[2]):
        if candidate in units:
            return units[candidate]
    groups = set(units.values())
    return groups.pop() if len(groups) == 1 else ""


def probe_pairs(plan: "Plan", source: RunStore, probe: RunStore) -> pd.DataFrame:
    """One row per judged input in either run: `_KEY`, ``group``, ``judge_model``,
    ``original`` and ``swapped`` verdict labels (None: unscored or absent), the original
    input's ``side`` (1, 2 or 0: `biaslab.evaluators.judge_bias`), ``swapped_terms`` and the
    ``lexicon`` applied."""
    nodes, lexicon = plan.group_swap.nodes, plan.group_swap.lexicon
    a, b = _verdicts(source, nodes, lexicon), _verdicts(probe, nodes, lexicon)
    both = a.merge(b, on=_KEY, how="outer", suffixes=("_source", ""))
    # the template's own terms are in both prompts; what the swap changed is half the
    # difference of the two leans: > 0, the original named side 1 more (he, men...)
    change = (both["lean_source"] - both["lean"]).fillna(0)
    both["side"] = [1 if c > 0 else 2 if c < 0 else 0 for c in change]
    both["judge_model"] = both["judge_model"].fillna(both["judge_model_source"])
    both["original"] = both["verdict_source"].astype(object).where(
        both["verdict_source"].notna(), None)
    both["swapped"] = both["verdict"].astype(object).where(both["verdict"].notna(), None)
    both["swapped_terms"] = both["swapped_terms"].fillna(0).astype(int)
    both["lexicon"] = both["lexicon"].fillna("")
    groups = _unit_groups(source, plan)
    both["group"] = [_group_of(str(item), groups.get(cell, {}))
                     for cell, item in zip(both["cell_id"], both["item"])]
    return both[[*_KEY, "group", "judge_model", "original", "swapped", "side",
                 "swapped_terms", "lexicon"]]


def _probe_table(pairs: pd.DataFrame, lexicon: str) -> pd.DataFrame:
    if pairs.empty:
        return pd.DataFrame(columns=PROBE_COLUMNS)
    pooled = pairs.assign(group=ALL_GROUPS)
    grouped = pairs[pairs["group"] != ""]
    frame = pd.concat([pooled, grouped], ignore_index=True)
    flips = verdict_flips(frame, by=_BY)
    counts = (frame.assign(has_terms=frame["swapped_terms"] > 0)
              .groupby(_BY, sort=True).agg(n_inputs=("node", "size"),
                                           n_inputs_swapped=("has_terms", "sum"))
              .reset_index())
    table = flips.merge(counts, on=_BY, how="left")
    table["lexicon"] = lexicon
    table["_pooled"] = table["group"] != ALL_GROUPS  # the pooled row first in each node
    table = table.sort_values(["node", "judge_model", "_pooled", "group"]).drop(
        columns="_pooled")
    return table[PROBE_COLUMNS]


def write_judge_probe(plan: "Plan", source: RunStore, probe: RunStore, run_dir: str | Path
                      ) -> list[Path]:
    """Write the probe's two tables under ``run_dir/tables`` and rewrite ``report.html`` so
    it shows them. Returns the tables' paths."""
    run_dir = Path(run_dir)
    tables = run_dir / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    swap = plan.group_swap
    table = _probe_table(probe_pairs(plan, source, probe), swap.lexicon.ref)
    path = tables / PROBE_FILE
    table.to_csv(path, index=False, float_format="%.6g")
    measures = tables / PROBE_MEASURES_FILE
    compared = tables / "compare_measures.csv"
    if compared.is_file():
        shutil.copyfile(compared, measures)
    write_html_report(probe, run_dir, plan.protocol.report_sections())
    return [path, *([measures] if measures.is_file() else [])]
