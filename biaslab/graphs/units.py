"""What one paired observation of a protocol is: its analysis unit.

An exposure's effect is measured by comparing the *same unit* in the clean arm and in an
exposed arm (or in a run and its counterfactual). The unit is the protocol's own: a test
record in amplification, a question in roleplay, a dialogue in multiturn, a source example in
augmentation. A protocol declares it once, as `Protocol.unit`; the generic report
(``exposed_vs_clean.csv``) and the counterfactual comparison (``compare_measures.csv``) read
the units from the cells' node outputs with it. A protocol that declares nothing gets
`ITEM_UNIT`: one unit per cell item, read from every node's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["AnalysisUnit", "Measure", "ITEM_UNIT", "any_true", "at_least"]


@dataclass(frozen=True)
class Measure:
    """A per-unit quantity computed from a unit's row, for one that is not a plain field.

    Attributes:
        name: the column name in the tables (e.g. ``ever_biased``).
        read: unit row (the un-flattened dict) → a number, a bool or a short label; None when
            the row does not tell (unscored: the pair is dropped, never imputed).
    """

    name: str
    read: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class AnalysisUnit:
    """How to read a protocol's units, their group and their measures from a cell's outputs.

    Attributes:
        name: what a unit is, in words (``record``, ``question``, ``dialogue``...).
        node: the node whose output holds the units, or several nodes (``("judge",
            "decide")``: a unit whose measures several nodes write, each read from its own
            node's output, the rows of each node paired on the unit id); None: every node's
            output, each one unit (the cell's item), compared field by field.
        rows: dotted key in that output holding the units: a list of dicts (one per unit, e.g.
            ``predictions``) or one dict (the cell's one unit, e.g. ``dialogue``); None: the
            output itself is the unit's row.
        id: the row field naming the unit (``record_id``, ``qid``), or a cell coordinate
            (``item``) when the row has no such field.
        group: the sensitive attribute the tables split by (a row field, an `attributes`
            field or a cell coordinate), or None when the protocol has none.
        strata: row fields that divide a unit's rows into parts compared separately (e.g. the
            question type); a unit with several rows in one stratum is their mean.
        measures: the fields compared (flattened names such as ``summary.biased``) and
            `Measure` s; empty: every numeric, boolean or short-label field except the
            bookkeeping ones.
        bookkeeping: fields never compared (ids, categories, counters); the unit's id, group
            and strata, and the graph's turn-loop counters, are always left out.
        attributes: ``(unit id, cell coordinates, options) → {field: value}`` for what a unit
            is but its outputs do not say (e.g. a test record's sex, read from its dataset).
        seed_units: False (the default): a run's seeds re-ask one unit, so the paired tables
            average a unit's seeds before pairing it (a pair is a unit). True where each seed
            makes a new unit, as in multiturn, whose simulated user writes another dialogue
            under each seed: then a pair is a (unit, seed).
    """

    name: str = "item"
    node: str | tuple[str, ...] | None = None
    rows: str | None = None
    id: str = "item"
    group: str | None = None
    strata: tuple[str, ...] = ()
    measures: tuple[str | Measure, ...] = ()
    bookkeeping: tuple[str, ...] = ()
    attributes: Callable[[Any, Mapping[str, Any], Any], Mapping[str, Any]] | None = None
    seed_units: bool = False

    @property
    def nodes(self) -> tuple[str, ...] | None:
        """The nodes whose outputs hold the units, as a tuple; None: every node."""
        if self.node is None:
            return None
        return (self.node,) if isinstance(self.node, str) else tuple(self.node)


ITEM_UNIT = AnalysisUnit()
"""The default: the cell's item is the unit, every node output field is compared."""


def any_true(name: str, rows: str, flag: str, *, upto: str | None = None) -> Measure:
    """A `Measure`: 1 when some entry of ``row[rows]`` has ``flag`` true, 0 when every entry
    has it false, None (unknown) when none is true and some is unlabelled or there is none.

    Args:
        upto: a row field holding how many leading entries count (e.g. the turns a dialogue
            actually ran); entries after it are ignored.
    """

    def read(row: Mapping[str, Any]) -> float | None:
        entries = list(row.get(rows) or [])
        if upto is not None and row.get(upto) is not None:
            entries = entries[:int(row[upto])]
        flags = [e.get(flag) for e in entries if isinstance(e, Mapping)]
        if any(v is True for v in flags):
            return 1.0
        if not flags or any(v is None for v in flags):
            return None
        return 0.0

    return Measure(name, read)


def at_least(name: str, field: str, threshold: float) -> Measure:
    """A `Measure`: 1 when ``row[field] >= threshold``, 0 below it, None when it is missing
    (e.g. a probability turned into the decision it stands for)."""

    def read(row: Mapping[str, Any]) -> float | None:
        value = row.get(field)
        return None if value is None else float(float(value) >= threshold)

    return Measure(name, read)
