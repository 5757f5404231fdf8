"""What a spec will cost and what it can detect, before anything runs (``biaslab estimate``).

- `estimate_plan`: cells, calls and tokens per variant and per model under test, from each
  protocol's `estimate` (a fresh run: no parse re-asks, no cache hits), plus the re-asks of
  any self-check mitigation arm.
- `wall_time_s`: the expected wall time from the endpoints' rate limits (``rps``), the run's
  concurrency and an assumed latency per call.
- `costs`: the cost from prices the user supplies (a model table's ``price_in_per_mtok`` /
  ``price_out_per_mtok``, or a prices file); biaslab ships no prices.
- `power_rows`: each protocol's main contrast (`Protocol.power_contrasts`) at the spec's
  sample size, sized by `biaslab.evaluators.power`, from a pilot run or stated assumptions.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from biaslab.errors import UserError
from biaslab.evaluators.exposure_effects import CLEAN_CONDITION
from biaslab.evaluators.power import (TESTS, PowerAssumptions, PowerContrast, achieved_power,
                                      check_effect, exact_minimum_detectable_effect,
                                      exact_required_n, minimum_detectable_effect, required_n)
from biaslab.experiments.plan import Plan
from biaslab.graphs.registry import Protocol

__all__ = ["estimate_plan", "wall_time_s", "call_latency", "LATENCY_BY_PROVIDER", "read_prices", "costs", "power_rows",
           "pilot_assumptions", "DEFAULT_OUTPUT_SHARE"]

DEFAULT_OUTPUT_SHARE = 0.25
"""The share of a cell's tokens taken as generated (priced at the output price) when the
protocol's `estimate` gives no ``tokens_out``: an assumption, stated with the cost."""


def estimate_plan(plan: Plan) -> dict[str, Any]:
    """Cells, calls and tokens of a fresh run, per variant and per model under test.

    Every node's calls count at the cell's model, also for nodes the spec binds to a model of
    their own (the estimates do not split a cell by node)."""
    generic = type(plan.protocol).estimate is Protocol.estimate
    memo: dict = {}
    per_variant: dict[str, list[float]] = {}
    per_model: dict[str, dict[str, float]] = {}
    for cell in plan.cells():
        key = cell.variant if generic else (cell.variant, cell.item)
        if key not in memo:
            memo[key] = plan.protocol.estimate(cell.variant, cell.item, plan.options)
        est = _with_self_checks(plan, cell, memo[key], memo)
        v = per_variant.setdefault(cell.variant, [0, 0.0, 0.0])
        v[0] += 1
        v[1] += est["calls"]
        v[2] += est["tokens"]
        m = per_model.setdefault(cell.model.label, {"calls": 0.0, "tokens": 0.0,
                                                    "tokens_out": 0.0, "out_known": True})
        m["calls"] += est["calls"]
        m["tokens"] += est["tokens"]
        if "tokens_out" in est:
            m["tokens_out"] += est["tokens_out"]
        else:
            m["out_known"] = False
    return {"spec": plan.spec.name, "scale": plan.spec.scale_applied,
            "cells": sum(v[0] for v in per_variant.values()),
            "calls_estimate": round(sum(v[1] for v in per_variant.values())),
            "tokens_estimate": round(sum(v[2] for v in per_variant.values())),
            "by_variant": {k: {"cells": a, "calls": round(b), "tokens": round(c)}
                           for k, (a, b, c) in per_variant.items()},
            "_by_model": per_model}


def _with_self_checks(plan: Plan, cell, est: Mapping[str, float], memo: dict
                      ) -> Mapping[str, float]:
    """A cell's estimate plus its self-check re-asks (mitigations at ``after-answer``): one
    more call per call of each node they target, as that node's own estimate counts them
    (`Protocol.node_estimates`; the re-ask's prompt also repeats the answer, so its tokens
    are a little above the estimate's)."""
    reviews = [m for m in cell.condition.mitigations if m.after_answer]
    if not reviews:
        return est
    key = ("nodes", cell.variant)
    if key not in memo:
        memo[key] = plan.protocol.node_estimates(cell.variant, plan.options)
    nodes = memo[key]
    extra = [nodes[n] for m in reviews for n in m.targets if n in nodes]
    out = dict(est)
    out["calls"] = est["calls"] + sum(e["calls"] for e in extra)
    out["tokens"] = est["tokens"] + sum(e["tokens"] for e in extra)
    if "tokens_out" in est:  # each re-ask answers again
        share = est["tokens_out"] / est["tokens"] if est["tokens"] else 0.0
        out["tokens_out"] = est["tokens_out"] + share * sum(e["tokens"] for e in extra)
    return out


LATENCY_BY_PROVIDER: dict[str, tuple[float, str]] = {
    "scripted": (0.0, "scripted: answers in-process, no model time"),
    "local": (0.95, "embedded SmolLM2: measured, make demo's 369 calls in 347 s of its jobs "
                    "on 2 idle cores, 8 servers side by side"),
}
"""Seconds a call takes, by provider, where biaslab knows it, and where the figure comes from.
Hosted providers are assumed at `HOSTED_LATENCY_S` unless ``--latency-s`` says otherwise."""
HOSTED_LATENCY_S = 2.0
_SERIAL = {"local"}  # the embedded model's figure is its throughput, whatever the concurrency


def call_latency(provider: str, override: float | None) -> tuple[float, str]:
    """(seconds per call, where that figure comes from) for one model."""
    if override is not None:
        return override, f"{override:g} s a call (--latency-s)"
    if provider in LATENCY_BY_PROVIDER:
        return LATENCY_BY_PROVIDER[provider]
    return HOSTED_LATENCY_S, f"{provider}: assumed {HOSTED_LATENCY_S:g} s a call (--latency-s)"


def wall_time_s(plan: Plan, by_model: Mapping[str, Mapping[str, float]],
                latency_s: float | None = None) -> tuple[float, list[str]]:
    """The expected wall time and the rate behind each model's share.

    Per model: its calls at its provider's latency (`call_latency`; ``latency_s`` overrides
    every model's) over the run's concurrency (the embedded model's calls one at a time), or
    its endpoint's ``rps`` where that is slower. The models' shares add up: a run's lanes are
    shared by all its models.
    """
    if latency_s is not None and (not latency_s >= 0 or not math.isfinite(latency_s)):
        raise UserError(f"--latency-s must be a non-negative number of seconds, got {latency_s}")
    models = {m.label: m for m in plan.models}
    calls_by_endpoint: dict[str, float] = {}
    rps: dict[str, float] = {}
    busy = 0.0
    basis: list[str] = []
    for label, usage in by_model.items():
        spec = models[label]
        seconds, why = call_latency(spec.provider, latency_s)
        if why not in basis:
            basis.append(why)
        lanes = 1 if spec.provider in _SERIAL else plan.spec.run.concurrency
        busy += usage["calls"] * seconds / lanes
        if spec.rps:
            calls_by_endpoint[spec.endpoint] = calls_by_endpoint.get(spec.endpoint, 0.0) \
                + usage["calls"]
            rps[spec.endpoint] = min(rps.get(spec.endpoint, spec.rps), spec.rps)
    limited = max((calls / rps[e] for e, calls in calls_by_endpoint.items()), default=0.0)
    return max(limited, busy), basis


_PRICE_KEYS = ("price_in_per_mtok", "price_out_per_mtok")


def read_prices(path: str | Path, plan: Plan) -> dict[str, tuple[float, float]]:
    """A TOML file of model label → ``price_in_per_mtok`` and ``price_out_per_mtok`` (your
    prices, per million tokens). One line for a model the spec does not test, or a bad price."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--prices: file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"--prices {path}: not valid TOML: {exc}") from None
    tested = {m.label for m in plan.models}
    out = {}
    for label, table in raw.items():
        if label not in tested:
            node_only = {m.label for m in plan.node_models.values()} - tested
            why = (" (it is bound to nodes only; their calls are counted at the model under "
                   "test)" if label in node_only else "")
            raise UserError(f"--prices {path}: unknown model '{label}'{why}; the spec tests: "
                            f"{', '.join(sorted(tested))}")
        if not isinstance(table, dict) or set(table) != set(_PRICE_KEYS):
            raise UserError(f"--prices {path}: [\"{label}\"] must set exactly "
                            f"{' and '.join(_PRICE_KEYS)}")
        values = tuple(table[k] for k in _PRICE_KEYS)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                   for v in values):
            raise UserError(f"--prices {path}: [\"{label}\"] prices must be numbers >= 0")
        out[label] = (float(values[0]), float(values[1]))
    return out


def costs(plan: Plan, by_model: Mapping[str, Mapping[str, float]],
          prices: Mapping[str, tuple[float, float]] | None = None,
          output_share: float = DEFAULT_OUTPUT_SHARE) -> dict[str, Any]:
    """Cost per priced model: ``tokens_in × price_in + tokens_out × price_out`` per million.

    Prices come from `prices` (a prices file), else the model's table; a model with neither
    is listed as unpriced. Tokens out are the estimate's ``tokens_out``, else `output_share`
    of its tokens."""
    if not 0 <= output_share <= 1:
        raise UserError(f"--output-share must lie in [0, 1], got {output_share}")
    models = {m.label: m for m in plan.models}
    by, unpriced, shared = {}, [], False
    for label, usage in by_model.items():
        spec = models[label]
        price = (prices or {}).get(label)
        if price is None and spec.price_in_per_mtok is not None \
                and spec.price_out_per_mtok is not None:
            price = (spec.price_in_per_mtok, spec.price_out_per_mtok)
        if price is None:
            unpriced.append(label)
            continue
        out = usage["tokens_out"] if usage["out_known"] else usage["tokens"] * output_share
        shared = shared or not usage["out_known"]
        tokens_in = usage["tokens"] - out
        by[label] = {"tokens_in": round(tokens_in), "tokens_out": round(out),
                     "cost": (tokens_in * price[0] + out * price[1]) / 1e6}
    return {"by_model": by, "total": sum(v["cost"] for v in by.values()),
            "unpriced": sorted(unpriced), "output_share": output_share if shared else None}


# --------------------------------------------------------------------------- power


def pilot_assumptions(run_dir: str | Path, contrast: PowerContrast,
                      fallback: PowerAssumptions) -> PowerAssumptions:
    """The contrast's baseline, SD(s) and within-unit correlation, read from a finished run of
    the same protocol: the clean arm's mean of the contrast's measure and the exposed − clean
    change on the same units (pooled over conditions, models and seeds). A label measure is
    read on its label that moves most (`_pilot_pairs`); a binary reading that falls is sized
    as its complement rising (baseline 1 − the clean mean; ρ is the same)."""
    from biaslab.experiments.replay import load_run_plan, open_run
    from biaslab.experiments.reports.units import unit_frame

    pilot = load_run_plan(run_dir, check_keys=False)
    frame = unit_frame(open_run(run_dir), pilot.protocol, pilot.options)
    if contrast.measure is None or frame.empty:
        raise UserError(f"--pilot {run_dir}: no units to read (an unfinished run, or a "
                        "protocol whose contrast names no measure)")
    field, pairs = _pilot_pairs(frame.dropna(subset=["value"]), contrast.measure, run_dir)
    frame = frame[frame["field"] == field].dropna(subset=["value"])
    clean = frame[frame["condition"] == CLEAN_CONDITION]
    change = pairs["value"] - pairs["value_clean"]
    baseline = float(clean["value"].mean())
    if change.mean() < 0:  # a fall in the reading is a rise in its complement: size that
        baseline = 1 - baseline
    values = set(frame["value"].unique())
    binary = values <= {0.0, 1.0}
    if contrast.binary and not binary:
        raise UserError(f"--pilot {run_dir}: measure '{contrast.measure}' is not 0/1")
    rho = float(pairs["value"].corr(pairs["value_clean"])) if binary else 0.0
    sd, sd_other = float(change.std(ddof=1)), None
    if contrast.design == "group_difference":
        parts = [change[pairs["group"] == g] for g in contrast.groups or ()]
        if len(parts) != 2 or min(len(p) for p in parts) < 2:
            raise UserError(f"--pilot {run_dir}: needs at least 2 pairs in each of the groups "
                            f"{contrast.groups}")
        sd, sd_other = float(parts[0].std(ddof=1)), float(parts[1].std(ddof=1))
    return replace(fallback, baseline=baseline if contrast.binary else fallback.baseline,
                   correlation=0.0 if math.isnan(rho) else max(rho, 0.0), sd=sd,
                   sd_other=sd_other,
                   source=f"pilot {run_dir} ({_reading(field, contrast.measure)}{len(pairs)} "
                          "pairs)")


_PAIR_KEYS = ["variant", "model", "node", "stratum", "item", "seed", "visit", "unit", "group"]


def _reading(field: str, measure: str) -> str:
    return f"{field}, " if field != measure else ""


def _pilot_pairs(frame, measure: str, run_dir) -> tuple[str, Any]:
    """The pilot's reading of `measure` and its exposed units paired with clean ones.

    A label measure has one 0/1 reading per label in the unit frame (``decision=older``):
    the reading whose mean moves most between the arms is the one sized (the effect the pilot
    shows), and the answer names it."""
    readings = [measure] if (frame["field"] == measure).any() else sorted(
        f for f in frame["field"].unique() if str(f).startswith(f"{measure}="))
    best = None
    for field in readings:
        part = frame[frame["field"] == field]
        clean = part[part["condition"] == CLEAN_CONDITION]
        exposed = part[part["condition"] != CLEAN_CONDITION]
        pairs = exposed.merge(clean[_PAIR_KEYS + ["value"]], on=_PAIR_KEYS,
                              suffixes=("", "_clean"))
        if len(pairs) < 2:
            continue
        moved = abs(float((pairs["value"] - pairs["value_clean"]).mean()))
        if best is None or moved > best[0]:
            best = (moved, field, pairs)
    if best is None:
        part = frame[frame["field"].isin(readings)]
        n_clean = int((part["condition"] == CLEAN_CONDITION).sum())
        found = (f"readings {', '.join(readings)}: " if readings != [measure] else "")
        raise UserError(f"--pilot {run_dir}: needs at least 2 exposed units of measure "
                        f"'{measure}' paired with clean ones ({found}found {n_clean} clean, "
                        f"{len(part) - n_clean} exposed)")
    return best[1], best[2]


def power_rows(plan: Plan, *, alpha: float = 0.05, power: float = 0.8,
               mde: float | None = None, assumptions: PowerAssumptions = PowerAssumptions(),
               pilot: str | None = None) -> list[dict[str, Any]]:
    """One row per main contrast: its n at the spec's size (per model under test), what it
    rests on, and the MDE at that n, or with `mde` the n that effect needs.

    ``mde`` and ``n_needed`` are the normal approximation's; ``power_at_mde`` and
    ``power_at_n_needed`` the power the contrast's own test (``test``) reaches there, computed
    exactly; ``mde_exact`` and ``n_needed_exact`` what that test needs for `power`."""
    seeds = len(plan.spec.run.seeds)
    rows = []
    for contrast in plan.protocol.power_contrasts(plan.options):
        per = "model" if contrast.pool_seeds else "model and seed"
        if contrast.seeds_averaged:
            per = "model" + (f", its {seeds} seeds averaged per {contrast.unit}"
                             if seeds > 1 else "")
        elif contrast.pool_seeds and seeds > 1:
            contrast = replace(contrast, n=contrast.n * seeds,
                               n_other=contrast.n_other and contrast.n_other * seeds)
        a = pilot_assumptions(pilot, contrast, assumptions) if pilot else assumptions
        normal = minimum_detectable_effect(contrast, a, alpha=alpha, power=power)
        row = {"contrast": contrast.label, "unit": contrast.unit, "design": contrast.design,
               "n": contrast.n, "n_other": contrast.n_other, "per": per,
               "alpha": alpha, "power": power, "assumptions": _describe(contrast, a),
               "source": a.source, "test": TESTS[contrast.test], "mde": normal,
               "power_at_mde": achieved_power(contrast, a, normal, alpha=alpha),
               "mde_exact": exact_minimum_detectable_effect(contrast, a, alpha=alpha,
                                                            power=power)}
        if mde is not None:
            check_effect(contrast, mde, a)
            row["effect"] = mde
            row["n_needed"] = required_n(contrast, mde, a, alpha=alpha, power=power)
            row["power_at_n_needed"] = achieved_power(contrast, a, mde, n=row["n_needed"],
                                                      alpha=alpha)
            row["n_needed_exact"] = exact_required_n(contrast, mde, a, alpha=alpha,
                                                     power=power)
        rows.append(row)
    return rows


def _describe(contrast: PowerContrast, a: PowerAssumptions) -> str:
    if contrast.design == "two_proportions":
        return f"baseline rate {a.baseline:.3g}"
    if contrast.design == "paired_binary":
        return f"baseline rate {a.baseline:.3g}, within-unit correlation {a.correlation:.3g}"
    if contrast.design == "paired_mean":
        return f"SD of the per-unit change {a.sd:.3g}"
    other = a.sd if a.sd_other is None else a.sd_other
    return f"SD of the per-unit change {a.sd:.3g} and {other:.3g}"
