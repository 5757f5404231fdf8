"""Replaying a finished run: rescore, strict re-execution, or a counterfactual with one change.

- rescore: the protocol's evaluators run over the stored traces; no model is called.
- strict: every cell runs again and every model call must come from the source trace; the
  node outputs are then compared byte for byte with the source's.
- counterfactual: every cell runs again with one node's prompt, model or exposure changed;
  calls whose inputs did not change come from the trace, the rest go to a model. The new run
  gets the protocol's tables and a comparison with its source.

A replay reads only the source run directory (its ``spec.toml`` records every model with its
endpoint), never the shell's environment, except API keys and URL credentials (``url_env``),
which are never written down. A replay that fails leaves no half-written directory
behind; one that is interrupted can be continued with ``resume=True``.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from biaslab.errors import ReplayMiss, UserError
from biaslab.experiments.interrupts import run_coroutine
from biaslab.experiments.plan import Plan, make_plan
from biaslab.experiments.runner import RunResult, open_store, run_in_progress, run_plan
from biaslab.graphs.registry import check_origin
from biaslab.experiments.spec import (ExperimentSpec, FromTurn, MitigationSettings,
                                      NodeSettings, SwapGroups, read_toml, spec_from_dict)
from biaslab.traces.store import STORE_FILE, RunStore

__all__ = ["load_run_plan", "load_run_spec", "open_run", "rescore", "strict_replay",
           "counterfactual", "compare_outputs", "OutputDiff", "CounterfactualResult",
           "check_not_running", "TARGET_KEYWORDS"]

TARGET_KEYWORDS = ("all", "singletons", "each_and_all")


def open_run(run_dir: str | Path, *, check_rows: bool = True) -> RunStore:
    """A finished or running run's store, read-only; one line when it is not a readable run
    (or, with `check_rows`, when one of its rows is damaged)."""
    run_dir = Path(run_dir)
    if not (run_dir / STORE_FILE).is_file():
        raise UserError(f"{run_dir} is not a run directory (no {STORE_FILE})")
    return open_store(run_dir, readonly=True, check_rows=check_rows)


def load_run_spec(run_dir: str | Path) -> ExperimentSpec:
    """The resolved spec a run was made with (from its spec.toml).

    Its models come from ``resolved_models``, endpoints included, so nothing is read from the
    environment except API keys and URL credentials (a model's ``url_env``)."""
    path = Path(run_dir) / "spec.toml"
    data = read_toml(path, "run spec")
    resolved = data.pop("resolved_models", {})
    data.pop("resolved_options", None)
    data["model_aliases"] = {**data.get("model_aliases", {}), **resolved}
    return spec_from_dict(data, where=str(path))


def load_run_plan(run_dir: str | Path, *, check_keys: bool = True) -> Plan:
    """The plan a run was made with; its protocol is loaded again from where the run recorded
    it (a user's file or module), with a warning when that code has changed since."""
    spec = load_run_spec(run_dir)
    try:
        plan = make_plan(spec, check_keys=check_keys)
    except UserError as exc:
        if spec.plugins or ":" in spec.protocol:
            raise UserError(f"cannot load protocol '{spec.protocol}' of run {run_dir} again "
                            f"(plugins: {', '.join(spec.plugins) or 'none'}): {exc}") from None
        raise
    store = open_store(run_dir, readonly=True, check_rows=False)  # only its meta is read
    try:
        recorded = store.meta().get("protocol_origin")
    finally:
        store.close()
    warning = check_origin(plan.protocol, recorded)
    if warning:
        print(f"biaslab: warning: {warning}", file=sys.stderr)
    return plan


def check_not_running(run_dir: str | Path, store: RunStore) -> None:
    """Refuse to report a run that another process is still writing: its tables would mix
    finished and missing cells without saying so."""
    if not run_in_progress(run_dir):
        return
    cells = store.cells()
    running = int((cells["status"] == "running").sum()) if len(cells) else 0
    done = int((cells["status"] == "done").sum()) if len(cells) else 0
    raise UserError(f"{run_dir} is still in progress ({done} cells done, {running} running); "
                    "report it when the run has finished")


def rescore(run_dir: str | Path, out_dir: str | Path | None = None, *,
            figures: bool = True) -> list[Path]:
    """Recompute the protocol's metrics, tables and figures from the trace alone, into the
    run's folder or, given `out_dir`, there (the run is then only read); `figures` False
    draws none (``--no-figures``)."""
    store = open_run(run_dir)
    try:
        check_not_running(run_dir, store)
        if not store.conn.execute("SELECT 1 FROM cells LIMIT 1").fetchone():
            # Empty tables over an emptied store would sit beside the old ones as if current.
            raise UserError(f"{run_dir} holds no cells (its store is empty): nothing to report")
        plan = load_run_plan(run_dir, check_keys=False)
        from biaslab.experiments.reports import write_reports  # (matplotlib, statsmodels)

        return write_reports(plan, store, Path(out_dir) if out_dir is not None
                             else Path(run_dir), figures=figures)
    finally:
        store.close()


@dataclass(frozen=True)
class OutputDiff:
    missing: list[tuple[str, int]]
    different: list[tuple[str, int]]
    compared: int

    @property
    def identical(self) -> bool:
        return not self.missing and not self.different


def compare_outputs(source: RunStore, replayed: RunStore) -> OutputDiff:
    """Byte-for-byte comparison of every node output of the source's finished cells."""
    done = source.cells()
    keep = set(done.loc[done["status"] == "done", "cell_id"]) if len(done) else set()
    a = {k: v for k, v in source.raw_outputs().items() if k[0] in keep}
    b = replayed.raw_outputs()
    missing = sorted(set(a) - set(b))
    different = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    return OutputDiff(missing, different, len(a))


class _Output:
    """The replay's output directory: new and empty unless resuming, and removed again when
    the replay fails, so that a failure never leaves a half-written run behind."""

    def __init__(self, out_dir: str | Path, source: str | Path, resume: bool):
        self.path = Path(out_dir)
        self.created = False
        if self.path.resolve() == Path(source).resolve():
            raise UserError(f"a replay writes a new run directory; --out must differ from "
                            f"the source {source}")
        if resume:
            if not (self.path / STORE_FILE).is_file():
                raise UserError(f"{self.path} holds no replay to resume (no {STORE_FILE}); "
                                "drop --resume to start one")
            return
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise UserError(f"{self.path} already exists; continue that replay with --resume, "
                            "or choose another --out")
        self.created = not self.path.exists()

    def discard(self) -> None:
        if self.created and self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)


def _endpoint_hint(plan: Plan) -> str:
    where = [f"{m.label} at {m.public().get('base_url') or m.provider}"
             for m in plan.all_model_specs()]
    return f" (models as recorded: {', '.join(where)})"


def strict_replay(run_dir: str | Path, out_dir: str | Path, *, progress: bool = True,
                  resume: bool = False, concurrency: int | None = None
                  ) -> tuple[RunResult, OutputDiff]:
    """Re-run every finished cell, answering every call from the source trace, and compare
    node outputs byte for byte. Raises `ReplayMiss` (and leaves nothing behind) on the first
    call the trace does not hold."""
    source = open_run(run_dir)
    try:
        plan = load_run_plan(run_dir, check_keys=False)
        cells = source.cells()
        done = set(cells.loc[cells["status"] == "done", "cell_id"]) if len(cells) else set()
        out = _Output(out_dir, run_dir, resume)
        try:
            # Cells that failed in the source have no complete trace to replay; they are skipped.
            result = run_coroutine(run_plan(plan, out.path, mode="strict", replay_from=[source],
                                            resume=resume, concurrency=concurrency,
                                            use_shared_cache=False, progress=progress,
                                            only=lambda cell: cell.id in done))
        except ReplayMiss as exc:
            out.discard()
            raise ReplayMiss(f"{exc}{_endpoint_hint(plan)}") from None
        except BaseException:
            out.discard()
            raise
        replayed = RunStore(out.path, readonly=True)
        diff = compare_outputs(source, replayed)
        replayed.close()
        return result, diff
    finally:
        source.close()


@dataclass
class CounterfactualResult:
    """A counterfactual run: its `RunResult`, the tables written and the comparison files."""

    run: RunResult
    tables: list[Path] = field(default_factory=list)
    comparison: list[Path] = field(default_factory=list)

    def __getattr__(self, name: str):  # counters, cells_failed, summary()... of the run
        if name == "run":
            raise AttributeError(name)
        return getattr(self.run, name)


def _variant_shadows(spec: ExperimentSpec, node: str, variant_name: str, shadow_dir: Path
                     ) -> None:
    """``--prompt @terse``: the node's own prompt in its ``terse`` variant, in every graph
    variant. Written as a shadowing overrides directory, because a node's default prompt
    may differ between graph variants (E0's prediction has no explanation to read)."""
    plan = make_plan(spec, check_keys=False)
    defaults = sorted({n.prompt for nodes in plan.llm_nodes.values() for n in nodes
                       if n.name == node})
    if not defaults:
        raise UserError(f"protocol '{plan.protocol.name}' has no LLM node '{node}' (nodes: "
                        f"{', '.join(sorted(n.name for ns in plan.llm_nodes.values() for n in ns))})")
    shadow_dir.mkdir(parents=True, exist_ok=True)
    for ref in defaults:
        template = plan.prompts.get(f"{ref.partition('@')[0]}@{variant_name}")
        target = shadow_dir / f"{ref.partition('@')[0]}.toml"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template.source, target)


def counterfactual(run_dir: str | Path, out_dir: str | Path, *, node: str = "",
                   prompt: str | None = None, model: str | None = None,
                   directions: list[str] | None = None, targets: str | list[str] | None = None,
                   position: str | None = None, template: str | None = None,
                   overrides: list[str] | None = None, from_turn: int | None = None,
                   mitigation: str | None = None, swap_groups: str | None = None,
                   tools: str | None = None, resume: bool = False, concurrency: int | None = None,
                   use_shared_cache: bool = True, progress: bool = True
                   ) -> CounterfactualResult:
    """Re-run with one change; unchanged calls are served from the source trace.

    Args:
        node: the node whose prompt or model changes.
        prompt: its new prompt (id, id@variant, a .toml file, or ``@variant`` for the variant
            of whichever prompt the node uses in each graph variant).
        model: its new model.
        directions, targets, position, template: a changed exposure grid.
        overrides: prompt directories that shadow the packaged prompts (and the run's own).
        mitigation: a mitigation arm added at `node` (``node`` may be ``a+b``): a name under
            ``prompts/mitigations/`` (``fairness_reminder``), a prompt id or a .toml file.
            Every arm of the source is run again with and without it; the arms without it
            are answered from the trace, so only the mitigated calls pay, and the new run's
            ``tables/mitigation_effects.csv`` pairs the two on the protocol's unit.
        swap_groups: the judge-bias probe: `node` (``a+b`` for several) sees its inputs with
            the group terms of this lexicon swapped (a TOML file; ``""`` or ``default``: the
            packaged ``group_terms``). The target's answers are the source's, from its trace,
            so only the judges' calls with a swapped term pay; the new run's
            ``tables/judge_bias_probe.csv`` counts the verdicts that flipped.
        from_turn: make the change only from this turn on (protocols with turns): the calls
            of turns 1..from_turn-1 are made with the source's settings, so they ask what the
            source asked and are answered from its trace; only turns from `from_turn` on pay.
            Recorded in the new run's spec (``[from_turn]``), so its resume and report know it.
        tools: an audited app's ``tools`` setting for this run (``replay``: a tool call the
            source never made fails the cell; ``live``: it runs); default: the source's.
        resume: continue an interrupted counterfactual in `out_dir`.

    Returns the run, the protocol's tables in `out_dir`, and the comparison with the source
    (``tables/compare_*``): per node and condition the calls, model calls and parse failures
    of both runs (``compare_calls.csv``); every measure of the protocol's unit, paired on the
    same units with a CI (``compare_measures.csv``); and the protocol's own ``compare`` hook
    when it has one (amplification: ``compare_fbs.csv``).
    """
    if not (prompt or model or directions or targets or position or template or overrides
            or mitigation or swap_groups is not None):
        raise UserError("counterfactual replay needs a change: --prompt, --model, --directions, "
                        "--targets, --position, --template, --overrides, --mitigation or "
                        "--swap-groups")
    if swap_groups is not None and not node:
        raise UserError("--swap-groups needs --node: the judge (or judges, as a+b) whose "
                        "inputs have their group terms swapped")
    if swap_groups is not None and from_turn is not None:
        raise UserError("--swap-groups goes without --from-turn: it swaps the judges' inputs "
                        "on every turn")
    if swap_groups is not None and (prompt or model or directions or targets or position
                                    or template or overrides or mitigation):
        raise UserError("--swap-groups is the judge-bias probe's only change, so that every "
                        "flip is the swap's; make the other change in a replay of its own "
                        "and probe that run")
    if (prompt or model) and not node:
        raise UserError("--prompt/--model need --node: the node whose binding changes")
    if mitigation and not node:
        raise UserError("--mitigation needs --node: the node (or nodes, as a+b) that hear it")
    source = open_run(run_dir)
    out = None
    try:
        out = _Output(out_dir, run_dir, resume)
        spec = load_run_spec(run_dir)
        nodes = dict(spec.nodes)
        prompt_dirs = [str(Path(d).resolve()) for d in (overrides or [])]
        for directory in prompt_dirs:
            if not Path(directory).is_dir():
                raise UserError(f"--overrides: {directory} is not a directory laid out like "
                                "biaslab/prompts")
        if prompt and prompt.startswith("@"):
            shadow = out.path / "prompt_variants"
            _variant_shadows(spec, node, prompt[1:], shadow)
            prompt_dirs.append(str(shadow.resolve()))
            prompt = None
        if prompt and prompt.endswith(".toml"):
            prompt = str(Path(prompt).resolve())
        if prompt or model:
            current = nodes.get(node, NodeSettings())
            nodes[node] = current.model_copy(update={k: v for k, v in
                                                     (("prompt", prompt), ("model", model)) if v})
        if isinstance(targets, list) and len(targets) == 1 and targets[0] in TARGET_KEYWORDS:
            targets = targets[0]
        changes = {k: v for k, v in (("directions", directions), ("targets", targets),
                                     ("position", position), ("template", template)) if v}
        try:
            conditions = spec.conditions.model_validate({**spec.conditions.model_dump(),
                                                         **changes})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise UserError(f"counterfactual conditions: {'.'.join(map(str, err['loc']))}: "
                            f"{err['msg']}") from None
        earlier = None
        if from_turn is not None:
            if spec.from_turn is not None:
                raise UserError(f"--from-turn: {run_dir} is itself a change from turn "
                                f"{spec.from_turn.turn}; replay its own source instead")
            earlier = _from_turn(from_turn, spec)
        mitigations = dict(spec.mitigations or {})
        if mitigation:
            name, settings = _mitigation_change(mitigation, node)
            if name in mitigations:
                raise UserError(f"--mitigation: run {run_dir} already has a mitigation "
                                f"'{name}'; replay with another one")
            mitigations[name] = settings
        if swap_groups is not None:
            if spec.swap_groups is not None:
                raise UserError(f"--swap-groups: {run_dir} is itself a judge-bias probe; "
                                "replay its own source instead")
            spec = spec.model_copy(update={"swap_groups": _swap_change(swap_groups, node,
                                                                       spec.protocol)})
        if tools is not None:
            if "app" not in spec.options:
                raise UserError("--tools applies to an audited app (a spec with app = ...), "
                                f"not to protocol '{spec.protocol}'")
            spec = spec.model_copy(update={"options": {**spec.options, "tools": tools}})
        spec = spec.model_copy(update={
            "nodes": nodes, "conditions": conditions,
            **({"mitigations": mitigations} if mitigations else {}),
            "prompt_overrides": [*prompt_dirs, *spec.prompt_overrides],
            **({"from_turn": earlier} if earlier else {})})
        plan = make_plan(spec)
        from biaslab.agents.app_tools import counterfactual_tools

        with counterfactual_tools():  # an app's tools: answered from the source's record
            result = run_coroutine(run_plan(plan, out.path, replay_from=[source], resume=resume,
                                            concurrency=concurrency,
                                            use_shared_cache=use_shared_cache,
                                            progress=progress))
    except BaseException:
        if out is not None:
            out.discard()
        source.close()
        raise
    try:
        change = {"node": node or None, "prompt": prompt or None, "model": model,
                  "overrides": prompt_dirs or None, "from_turn": from_turn,
                  "mitigation": mitigation, "tools": tools,
                  "swap_groups": (spec.swap_groups.lexicon if spec.swap_groups else None),
                  **changes}
        store = RunStore(out.path)
        store.set_meta(source_run=str(Path(run_dir).resolve()),
                       source_fingerprint=source.meta().get("fingerprint"),
                       counterfactual={k: v for k, v in change.items() if v is not None})
        store.close()
        done = CounterfactualResult(result)
        if result.interrupted:
            return done
        replayed = RunStore(out.path, readonly=True)
        try:
            from biaslab.datasets.fit_cache import fits_on_disk
            from biaslab.experiments.reports import write_reports

            with fits_on_disk(use_shared_cache):  # its report too, as the run's cells
                done.tables = list(write_reports(plan, replayed, out.path))
            done.comparison = _compare(plan, source, replayed, out.path / "tables")
        finally:
            replayed.close()
        return done
    finally:
        source.close()


def _swap_change(lexicon: str, node: str, protocol: str) -> SwapGroups:
    """``--swap-groups [LEXICON] --node a+b`` as the spec's ``[swap_groups]``, with the pairs
    read now (the packaged lexicon's shared pairs plus the protocol's own group names)."""
    from biaslab.prompts.group_swap import load_lexicon

    path = None if lexicon in ("", "default") else str(Path(lexicon).resolve())
    loaded = load_lexicon(path, protocol.rpartition(":")[2] if ":" in protocol else protocol)
    return SwapGroups(nodes=[n for n in node.split("+") if n], lexicon=path or loaded.name,
                      pairs=[list(p) for p in loaded.pairs])


def _mitigation_change(mitigation: str, node: str) -> tuple[str, MitigationSettings]:
    """``--mitigation`` as a ``[mitigations]`` entry: its name and settings."""
    if mitigation.endswith(".toml"):
        path = Path(mitigation).resolve()
        return path.stem.partition(".")[0], MitigationSettings(targets=node, template=str(path))
    name = mitigation.rpartition("/")[2].partition("@")[0]
    template = mitigation if "/" in mitigation else f"mitigations/{mitigation}"
    try:
        return name, MitigationSettings(targets=node, template=template)
    except ValidationError as exc:
        raise UserError(f"--mitigation: {exc.errors()[0]['msg']}") from None


def _from_turn(turn: int, source: ExperimentSpec) -> FromTurn:
    """The source's settings, kept for the turns before `turn`."""
    try:
        return FromTurn(turn=turn, nodes_before=dict(source.nodes),
                        conditions_before=source.conditions,
                        prompt_overrides_before=list(source.prompt_overrides))
    except ValidationError as exc:
        raise UserError(f"--from-turn {turn}: {exc.errors()[0]['msg']} (turn 1 is the whole "
                        "dialogue: drop --from-turn)") from None


def _compare(plan: Plan, source: RunStore, replayed: RunStore, out_dir: Path) -> list[Path]:
    from biaslab.experiments.reports.compare import compare_calls, compare_measures
    from biaslab.experiments.reports.mitigations import unmitigated

    written = [compare_calls(source, replayed, out_dir),
               compare_measures(source, replayed, out_dir, plan.protocol, plan.options)]
    if plan.group_swap is not None:
        from biaslab.experiments.reports.judge_probe import write_judge_probe

        written += write_judge_probe(plan, source, replayed, out_dir.parent)
    with unmitigated(replayed):  # the protocol's comparison knows no mitigation arms
        from biaslab.experiments.reports import protocol_compare

        return written + protocol_compare(plan.protocol, source, replayed, out_dir,
                                          plan.options)
