"""The ``biaslab`` command line. Bad input → one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sqlite3
import sys
from pathlib import Path

from biaslab.errors import UserError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not a usage dump
        command = self.prog.removeprefix("biaslab").strip()
        raise UserError(f"{command}: {message}" if command else message)


def _default_out(spec_name: str, scale: str) -> Path:
    return Path("runs") / f"{spec_name}-{scale}"


def cmd_run(args) -> int:
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.runner import keep_run_dir_locked
    from biaslab.experiments.spec import load_spec
    from biaslab.experiments.workers import resolve_workers

    if (args.resume and not Path(args.spec).exists() and not args.spec.endswith(".toml")):
        raise UserError(f"no run directory at {args.spec} to resume (start one with: biaslab "
                        f"run SPEC.toml --out {args.spec})")
    if Path(args.spec).is_dir():  # a run directory: continue it from its recorded spec
        plan, out = _recorded_run(args)
    else:
        spec = load_spec(args.spec, scale=args.scale)
        plan = make_plan(spec, models=[args.model] if args.model else None,
                         all_nodes=args.all_nodes)
        out = Path(args.out) if args.out else _default_out(spec.name, spec.scale_applied)
        if args.model and plan.node_models:
            kept = ", ".join(f"{node} → {m.label}" for node, m in sorted(plan.node_models.items()))
            print(f"biaslab: --model replaces the model axis; these nodes keep their own model: "
                  f"{kept} (add --all-nodes to put them on {args.model} too)", file=sys.stderr)
    if args.lanes:  # recorded with the spec, so shard workers and resumes use it too
        plan.spec.run.lanes = args.lanes
    if args.resume:  # a refused resume says so first, and creates nothing
        from biaslab.experiments.runner import check_resumable

        check_resumable(out)
    choice = resolve_workers(plan, args.workers, shard=args.shard, executor=args.executor)
    _check_shared_cache(args, choice.workers)
    print(f"biaslab: {plan.n_cells()} cells → {out}", file=sys.stderr)
    if choice.why:
        print(choice.announce("--workers 1"), file=sys.stderr)
    with keep_run_dir_locked(out):  # the report is written under the run's writer lock
        return _run_and_report(args, plan, out, choice.workers)


def _run_and_report(args, plan, out, workers: int) -> int:
    """Run the plan into `out` (it takes the writer lock), then write its report."""
    from biaslab.experiments.interrupts import CtrlC, kept_message
    from biaslab.traces.store import RunStore

    resume_hint = f"biaslab run --resume {out}"
    # Ctrl-C: the first stops the run (finished cells and returned answers are kept), a second
    # quits at once; see biaslab.experiments.interrupts.
    with CtrlC(out, plan.n_cells()) as ctrl_c:
        try:
            result = _dispatch_run(args, plan, out, ctrl_c, workers)
        except KeyboardInterrupt:
            print(kept_message(out, plan.n_cells()), file=sys.stderr)
            return ctrl_c.leave()
        print(result.summary(), file=sys.stderr)
        if result.cells_failed:
            store = RunStore(out, readonly=True)
            failed = store.cells().query("status == 'error'")
            store.close()
            for _, cell in failed.head(3).iterrows():
                print(f"  failed: {cell['cell_id']}: {cell['error']}", file=sys.stderr)
            print(f"  fix the cause, then: {resume_hint}", file=sys.stderr)
        if result.interrupted:
            print(kept_message(out, plan.n_cells()), file=sys.stderr)
            return ctrl_c.leave()
    if args.shard:
        print(f"  shard {args.shard} done; combine the shards with: biaslab merge "
              "RUN_DIR... --out DIR", file=sys.stderr)
    if not args.no_report and not args.shard:
        _write_report(plan, out, done="the run's cells are all kept")
        _print_headline(plan.protocol, out)
    return 1 if result.cells_failed else 0


def _check_shared_cache(args, workers: int) -> None:
    """A shared cache path that cannot work stops the run before anything is written (shard
    workers open it only after their directories exist). Workers on this machine get it
    repaired here first, so that no two of them move a damaged cache aside at once."""
    from biaslab.traces.cache import shared_cache_path
    from biaslab.traces.shared_cache import check_shared_cache, open_shared_cache

    path = None if args.no_cache else shared_cache_path()
    if path is None:
        return
    if workers > 1 and args.executor == "local" and not args.shard:
        open_shared_cache(path).close()
    else:
        check_shared_cache(path)


def _dispatch_run(args, plan, out, ctrl_c, workers: int):
    """One process, one shard (``--shard``), or shards in `workers` (``--workers``, Ray)."""
    from biaslab.experiments import shards
    from biaslab.experiments.runner import run_plan

    if args.shard:
        if args.workers or args.executor != "local":
            raise UserError("--shard runs one shard in this process; it does not combine with "
                            "--workers or --executor")
        i, n = shards.parse_shard(args.shard)
        result = ctrl_c.run(run_plan(plan, out, resume=args.resume,
                                     concurrency=args.concurrency,
                                     use_shared_cache=not args.no_cache,
                                     progress=not args.quiet, only=shards.in_shard(i, n, plan),
                                     shard=True))
        shards.mark_shard(out, i, n)
        return result
    if workers > 1 or args.executor == "ray":
        return shards.run_sharded(plan, out, workers=workers, executor=args.executor,
                                  resume=args.resume, concurrency=args.concurrency,
                                  use_shared_cache=not args.no_cache,
                                  ray_address=args.ray_address, progress=not args.quiet)
    return ctrl_c.run(run_plan(plan, out, resume=args.resume, concurrency=args.concurrency,
                               use_shared_cache=not args.no_cache, progress=not args.quiet))


def cmd_merge(args) -> int:
    from biaslab.experiments.replay import load_run_plan
    from biaslab.experiments.runner import keep_run_dir_locked
    from biaslab.experiments.shards import merge_runs, missing_shards

    missing = missing_shards(args.run_dirs)
    if missing and not args.allow_partial:
        raise UserError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of this "
                        f"run {'are' if len(missing) > 1 else 'is'} not among the runs to merge; add them, or pass "
                        "--allow-partial to merge these alone (the tables then cover part "
                        "of the grid)")
    with keep_run_dir_locked(args.out):  # the report is written under the writer lock
        merged = merge_runs(args.run_dirs, args.out)
        print(f"merged {merged.sources} runs into {merged.out}: {merged.cells_done} cells "
              f"done, {merged.cells_error} failed", file=sys.stderr)
        plan = load_run_plan(args.out, check_keys=False)
        absent = plan.n_cells() - merged.cells_done - merged.cells_error
        if absent > 0:
            print(f"biaslab: warning: the merged run lacks {absent} of its {plan.n_cells()} "
                  f"cells{' (shards ' + ', '.join(missing) + ' missing)' if missing else ''}; "
                  "its tables cover the rest only", file=sys.stderr)
        if not args.no_report:
            _write_report(plan, Path(args.out), done="the merged run is kept")
    return 0


def _write_report(plan, out: Path, done: str) -> None:
    """Tables, figures and report.html of the run (or merged run) in `out`, from its store.
    `done`: what a Ctrl-C here keeps (said with how to write the report again)."""
    from biaslab.experiments.interrupts import set_interrupt_hint
    from biaslab.experiments.reports import write_reports
    from biaslab.traces.store import RunStore

    set_interrupt_hint(f"{done}; write its report with: biaslab report {out}")
    store = RunStore(out, readonly=True)
    try:
        written = write_reports(plan, store, out)
    finally:
        store.close()
    set_interrupt_hint(None)
    for path in written:
        print(f"  wrote {path}")


def _print_headline(proto, run_dir) -> None:
    """The protocol's headline table (e.g. amplification's Table 1) as a rich table."""
    from biaslab.experiments.reports import protocol_headline

    frame = protocol_headline(proto, Path(run_dir))
    if frame is None or frame.empty:
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout)
    if not console.is_terminal:  # a file or pipe gets whole rows, not wrapped cells
        console.width = 10_000
    title = frame.attrs.get("title")
    rows = [["" if v is None else str(v) for v in row]
            for row in frame.itertuples(index=False, name=None)]
    table = Table(title=title, title_justify="left")
    for col in frame.columns:
        table.add_column(str(col), no_wrap=True)
    for row in rows:
        table.add_row(*row)
    widths = [max([len(str(col))] + [len(row[i]) for row in rows])
              for i, col in enumerate(frame.columns)]
    if sum(widths) + 3 * len(widths) + 1 <= console.width:  # the table's borders and padding
        console.print(table)
        return
    # Too wide for the terminal: the fields every row shares once, then one block per row
    # under a rule, its fields packed "name value" side by side, so no number is cut.
    if title:
        console.print(title, style="bold", soft_wrap=True)
    names = [str(c) for c in frame.columns]
    shared = [i for i in range(len(names)) if len(rows) > 1 and len({r[i] for r in rows}) == 1]
    own = [i for i in range(len(names)) if i not in shared]
    if shared:
        console.print("every row:", style="dim")
        _print_packed(console, [(names[i], rows[0][i]) for i in shared])
    for n, row in enumerate(rows, 1):
        rule = f"── row {n} of {len(rows)} "
        console.print(rule + "─" * max(0, min(console.width, 80) - len(rule) - 1), style="dim")
        _print_packed(console, [(names[i], row[i]) for i in own])


def _print_packed(console, fields: list[tuple[str, str]]) -> None:
    """``name value`` pairs, as many to a line as the terminal's width holds (a pair wider
    than the line gets a line of its own and wraps)."""
    line = ""
    for name, value in fields:
        piece = f"{name} {value}"
        if line and len(line) + 3 + len(piece) > console.width - 1:
            console.print(line, soft_wrap=True, highlight=False)
            line = ""
        line = f"{line} · {piece}" if line else f"  {piece}"
    if line:
        console.print(line, soft_wrap=True, highlight=False)


def _recorded_run(args):
    """``biaslab run --resume RUN_DIR``: the plan a run directory was made with, from its
    spec.toml alone (scale, models and endpoints included), so no flag has to be repeated."""
    from biaslab.experiments.replay import load_run_plan, open_run

    run_dir = Path(args.spec)
    if not args.resume:
        raise UserError(f"{run_dir} is a directory; to continue the run in it: "
                        f"biaslab run --resume {run_dir}")
    for flag, value in (("--scale", args.scale), ("--model", args.model),
                        ("--all-nodes", args.all_nodes)):
        if value:
            raise UserError(f"{flag} cannot change a recorded run; "
                            f"biaslab run --resume {run_dir} continues it as it was made")
    if args.out and Path(args.out).resolve() != run_dir.resolve():
        raise UserError(f"--out {args.out} differs from the run directory {run_dir}; a resumed "
                        "run continues in its own directory")
    open_run(run_dir, check_rows=False).close()  # one line if it is not a readable run
    if not (run_dir / "spec.toml").is_file():  # killed after its store was made, before this
        raise UserError(f"{run_dir} holds a run store but no spec.toml (the run was stopped "
                        "before it recorded its spec); continue it with the spec it was "
                        f"started from: biaslab run SPEC.toml --out {run_dir} --resume")
    return load_run_plan(run_dir), run_dir


def cmd_report(args) -> int:
    from biaslab.experiments.interrupts import set_interrupt_hint
    from biaslab.experiments.replay import load_run_plan, rescore

    set_interrupt_hint(f"the run is unchanged; write its report with: biaslab report "
                       f"{args.run_dir}")
    for path in rescore(args.run_dir):
        print(f"wrote {path}")
    _print_headline(load_run_plan(args.run_dir, check_keys=False).protocol, args.run_dir)
    return 0


def cmd_replay(args) -> int:
    from biaslab.experiments import replay

    if args.from_turn is not None and args.mode != "counterfactual":
        raise UserError("--from-turn goes with --mode counterfactual (it says from which turn "
                        "the change applies)")
    if args.sensitivity and args.mode != "rescore":
        raise UserError("--sensitivity goes with --mode rescore")
    if args.mode == "rescore":
        if args.judge_node:
            return _judge_traces(args)
        if args.sensitivity:  # its refusals come before the tables are rewritten
            from biaslab.experiments.judge_sensitivity import check_judge_sensitivity

            check_judge_sensitivity(args.run_dir, args.judges)
        for path in replay.rescore(args.run_dir, args.out):
            print(f"wrote {path}")
        if args.sensitivity:
            return _judge_sensitivity(args)
        return 0
    from biaslab.experiments.import_traces import refuse_rerun

    refuse_rerun(args.run_dir, args.mode)
    out = Path(args.out) if args.out else Path(f"{args.run_dir.rstrip('/')}-{args.mode}")
    from biaslab.experiments.interrupts import CtrlC

    # Ctrl-C as in `biaslab run`: the first stops the replay (what is finished is kept, for
    # --resume), a second quits at once.
    flags = " (with the same flags)" if args.mode == "counterfactual" else ""
    hint = f"biaslab replay {args.run_dir} --mode {args.mode} --out {out} --resume{flags}"
    with CtrlC(out, None, hint=hint) as ctrl_c:
        code = _replay_into(args, out)
        return ctrl_c.leave(code) if code == 130 else code


def _replay_into(args, out: Path) -> int:
    """A strict or counterfactual replay of ``args.run_dir`` into `out`."""
    from biaslab.experiments import replay

    if args.mode == "strict":
        result, diff = replay.strict_replay(args.run_dir, out, progress=not args.quiet,
                                            resume=args.resume, concurrency=args.concurrency)
        print(result.summary(), file=sys.stderr)
        if result.interrupted:
            print(f"continue with: biaslab replay {args.run_dir} --mode strict --out {out} "
                  "--resume", file=sys.stderr)
            return 130
        if diff.identical:
            print(f"strict replay: {diff.compared} node outputs identical, "
                  f"{result.counters.model_calls} model calls")
            return 0
        print(f"strict replay: {len(diff.different)} outputs differ, {len(diff.missing)} missing "
              f"(first: {(diff.different or diff.missing)[0]})")
        return 1
    changes = (args.prompt, args.model, args.directions, args.targets, args.position,
               args.template, args.overrides, args.mitigation, args.swap_groups)
    if not any(changes):
        raise UserError("replay --mode counterfactual needs a change: --node with --prompt, "
                        "--model, --mitigation or --swap-groups, or --directions, --targets, "
                        "--position, --template, --overrides")
    done = replay.counterfactual(args.run_dir, out, node=args.node or "", prompt=args.prompt,
                                 model=args.model, directions=args.directions,
                                 targets=args.targets, position=args.position,
                                 template=args.template, overrides=args.overrides,
                                 mitigation=args.mitigation, swap_groups=args.swap_groups,
                                 from_turn=args.from_turn, tools=args.tools,
                                 resume=args.resume, concurrency=args.concurrency,
                                 use_shared_cache=not args.no_cache, progress=not args.quiet)
    print(done.summary(), file=sys.stderr)
    print(f"counterfactual run in {out}: {done.counters.model_calls} model calls, "
          f"{done.counters.cache_hits} answered from the trace or cache")
    if done.run.interrupted:
        print(f"continue with the same flags and --out {out} --resume", file=sys.stderr)
        return 130
    for path in [*done.tables, *done.comparison]:
        print(f"wrote {path}")
    return 1 if done.cells_failed else 0


def _judge_sensitivity(args) -> int:
    from biaslab.experiments.judge_sensitivity import judge_sensitivity

    result = judge_sensitivity(args.run_dir, judges=args.judges, progress=not args.quiet,
                               concurrency=args.concurrency, out_dir=args.out)
    configs = result.runs[~result.runs["configuration"].str.contains("^(?:alternate:|panel$)")]
    computed = int((configs["status"] != "not computable").sum())
    flips = result.bands[result.bands["sign_flips"] | result.bands["significance_flips"]]
    print(f"judge sensitivity over {' '.join(result.members)}: {computed} configurations, "
          f"{len(flips)} of {len(result.bands)} headline rows flip sign or significance; "
          f"{result.paid_calls} model calls paid (alternate judges only)")
    for path in result.tables:
        print(f"wrote {path}")
    return 0


def _judge_traces(args) -> int:
    import biaslab.graphs  # noqa: F401  (the protocols register their synthetic models)
    from biaslab.evaluators.over_traces import judge_traces

    if not args.judges:
        raise UserError("--judge-node needs --judges MODEL [MODEL ...]")
    if args.sensitivity and len(set(args.judges)) != len(args.judges):
        raise UserError("--sensitivity: each judge once in --judges (each is a member of the "
                        "panel it re-weighs)")
    if args.sensitivity and len(args.judges) < 2:
        raise UserError("--sensitivity with --judge-node re-weighs the judges of --judges: "
                        "give two or more")
    result = judge_traces(args.run_dir, node=args.judge_node, prompt=args.judge_prompt,
                          judges=args.judges, repeats=args.repeats or 1, labels=args.labels,
                          name=args.eval_name)
    scores = result.scores
    print(f"judged {len(scores)} recorded '{args.judge_node}' answers with {len(args.judges)} "
          f"judge(s) x {args.repeats or 1}: {result.judge_calls} judge calls, 0 target calls")
    if len(scores):
        labels = scores["label"].fillna("(unscored)")
        # an imported run's cells carry their group (the item key --group named): by group
        keys = ["group"] if "group" in scores else ["target", "direction"]
        table = labels.groupby([scores[k].fillna("") for k in keys]
                               ).value_counts().rename("answers")
        print(table.to_string())
        print(f"wrote {result.eval_dir / 'scores.csv'}")
    if result.failed:
        from biaslab.agents.providers import parse_model

        where = ", ".join(f"{m.label} at {m.public().get('base_url') or m.provider}"
                          for m in map(parse_model, args.judges))
        print(f"error: {result.failed} judge call(s) failed for good, {result.not_started} "
              f"not started ({where}): {result.first_error}; the {len(scores)} judged answers "
              f"are kept: fix the cause and run the same command again to continue",
              file=sys.stderr)
        return 1
    if args.sensitivity:
        return _trace_judge_sensitivity(args, result)
    return 0


def _trace_judge_sensitivity(args, judged) -> int:
    from biaslab.experiments.trace_judge_sensitivity import trace_judge_sensitivity
    from biaslab.prompts.registry import PromptRegistry

    labels = list(args.labels or PromptRegistry().get(args.judge_prompt).labels)
    result = trace_judge_sensitivity(args.run_dir, eval_name=args.eval_name, labels=labels,
                                     out_dir=args.out, paid_calls=judged.judge_calls)
    configs = result.runs[result.runs["configuration"] != "panel"]
    flips = result.bands[result.bands["sign_flips"] | result.bands["significance_flips"]]
    print(f"judge sensitivity over {' '.join(result.members)}: {len(configs)} configurations, "
          f"{len(flips)} of {len(result.bands)} headline rows flip sign or significance; "
          f"0 further model calls")
    for path in result.tables:
        print(f"wrote {path}")
    return 0


def _protocol_from_arg(name_or_spec: str, plugins: list[str] | None):
    """A protocol named on the command line, or the one a spec file names (with its plugins)."""
    from biaslab.experiments.spec import load_spec
    from biaslab.graphs.registry import get_protocol, load_plugin

    for plugin in plugins or []:
        load_plugin(plugin)
    if name_or_spec.endswith(".toml"):
        spec = load_spec(name_or_spec)
        for plugin in spec.plugins:
            load_plugin(plugin)
        return get_protocol(spec.protocol), spec.options
    return get_protocol(name_or_spec), {}


def cmd_biaslens_released(args) -> int:
    from biaslab.experiments import biaslens_released as released

    counts, _ = released.score_release(args.root, args.model, args.condition, args.out,
                                       args.bank)
    print(released.totals(counts).to_string(index=False))
    notes = released.release_notes(counts)
    for note in notes.itertuples():
        print(f"note: {note.model} {note.condition}: {note.kind}: {note.detail}"
              + (f" ({note.rows:.0f} rows)" if note.rows == note.rows and note.rows else ""))
    return 0


def cmd_import_traces(args) -> int:
    from biaslab.experiments.import_traces import gap_lines, import_traces

    done = import_traces(args.file, args.out, group=args.group, unit=args.unit,
                         outcome=args.outcome, since=args.since, until=args.until,
                         tag=args.tag)
    print(f"imported {done.traces} traces ({done.format}) with {done.calls} model calls of "
          f"nodes {', '.join(done.nodes) or 'none'} into {done.out}")
    for line in gap_lines(done.gaps):
        print(f"gap: {line}")
    return 0


def cmd_import_biaslens(args) -> int:
    from biaslab.experiments.import_biaslens import import_biaslens, import_summary

    done = import_biaslens(args.root, args.out, models=args.model, conditions=args.condition,
                           bank_dir=args.bank, chunk_size=args.chunk_size,
                           progress=not args.quiet)
    for line in import_summary(done):
        print(line)
    return 0


def cmd_graph(args) -> int:
    proto, raw_options = _protocol_from_arg(args.protocol, args.plugins)
    options = proto.parse_options(raw_options)
    variants = proto.variants(options)
    chosen = [args.variant] if args.variant else variants
    for variant in chosen:
        if variant not in variants:
            raise UserError(f"protocol '{args.protocol}' has no variant '{variant}' "
                            f"(variants: {', '.join(variants)})")
        if len(chosen) > 1:
            print(f"%% {args.protocol} {variant}")
        print(proto.build(variant, options).compile().get_graph().draw_mermaid())
    return 0


def cmd_protocols(args) -> int:
    from biaslab.graphs.registry import get_protocol, list_protocols, load_plugin, protocol_origin

    for plugin in args.plugins or []:
        load_plugin(plugin)
    names = list_protocols()
    if args.spec:  # the spec's protocol only (its plugins may register others beside it)
        names = [_protocol_from_arg(args.spec, None)[0].name]
    for name in names:
        proto = get_protocol(name)
        origin = protocol_origin(proto)
        where = "built in" if origin["builtin"] else (origin["file"] or origin["module"])
        print(f"{name}  ({where})")
        options = proto.Options()
        for variant in proto.variants(options):
            nodes = ", ".join(n.name for n in proto.llm_nodes(variant, options)) or "-"
            print(f"  {variant}: LLM nodes {nodes}")
        if proto.directions:
            print(f"  directions: {', '.join(proto.directions)}")
    return 0


def cmd_prompts(args) -> int:
    from biaslab.prompts.registry import PromptRegistry

    registry = PromptRegistry(args.overrides or [])
    if args.action == "list":
        for t in registry.list():
            print(f"{t.ref:45s} {t.content_hash}  slots: {', '.join(t.slots) or '-'}")
        return 0
    if not args.ref:
        raise UserError("prompts show needs a prompt id, e.g. amplification/predict")
    t = registry.get(args.ref)
    print(f"# {t.ref}  ({t.source})\n# slots: {', '.join(t.slots)}  hash: {t.content_hash}")
    if t.description:
        print(f"# {t.description}")
    if t.system:
        print(f"\n[system]\n{t.system}")
    print(f"\n[user]\n{t.user}")
    return 0


def cmd_estimate(args) -> int:
    from biaslab.evaluators.power import PowerAssumptions
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.planning import (costs, estimate_plan, power_rows, read_prices,
                                              wall_time_s)
    from biaslab.experiments.spec import load_spec, read_spec_scales

    if args.latency_s is not None and not args.latency_s >= 0:
        raise UserError(f"estimate: --latency-s must be >= 0 seconds, got {args.latency_s}")
    if args.baseline is not None and not 0 < args.baseline < 1:
        raise UserError(f"estimate: --baseline must lie in (0, 1), got {args.baseline}")
    if not -1 <= args.correlation <= 1:
        raise UserError(f"estimate: --correlation must lie in [-1, 1], got {args.correlation}")
    if not args.sd > 0:
        raise UserError(f"estimate: --sd must be > 0, got {args.sd}")
    assumptions = PowerAssumptions(correlation=args.correlation, sd=args.sd,
                                   **({"baseline": args.baseline} if args.baseline else {}))
    want_power = args.power or args.mde is not None
    scales = [args.scale] if args.scale else ["paper", *read_spec_scales(args.spec)]
    reports = []
    for scale in scales:
        spec = load_spec(args.spec, scale=scale)
        plan = make_plan(spec, models=[args.model] if args.model else None,
                         all_nodes=args.all_nodes, check_keys=False)
        report = estimate_plan(plan)
        by_model = report.pop("_by_model")
        prices = read_prices(args.prices, plan) if args.prices else None
        wall, basis = wall_time_s(plan, by_model, args.latency_s)
        report["latency_s"] = args.latency_s
        report["wall_time_s"] = round(wall)
        report["wall_time_basis"] = basis
        report["cost"] = costs(plan, by_model, prices, args.output_share)
        if want_power:
            report["power"] = power_rows(plan, mde=args.mde, assumptions=assumptions,
                                         pilot=args.pilot)
        reports.append(report)
    if args.json:
        print(json.dumps(reports[0] if args.scale else reports, indent=2))
        return 0
    for report in reports:
        print(f"{report['spec']} ({report['scale']}): {report['cells']} cells, about "
              f"{report['calls_estimate']:,} model calls and {report['tokens_estimate']:,} "
              "tokens")
        for k, v in report["by_variant"].items():
            print(f"  {k}: {v['cells']} cells, ~{v['calls']:,} calls, ~{v['tokens']:,} tokens")
        print(f"  wall time: ~{_duration(report['wall_time_s'])} (at "
              f"{'; '.join(report['wall_time_basis'])}; the spec's concurrency and each "
              "endpoint's rps)")
        _print_cost(report["cost"])
        for row in report.get("power", []):
            _print_power(row)
        if want_power and not report.get("power"):
            print("  power: this spec has no main contrast to size")
    print("These are estimates of a fresh run (no re-asks after a parse failure, no cache "
          "hits), not bounds.")
    return 0


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _print_cost(cost: dict) -> None:
    for label, v in cost["by_model"].items():
        print(f"  cost {label}: {v['cost']:,.2f} ({v['tokens_in']:,} tokens in, "
              f"{v['tokens_out']:,} out, at your prices)")
    if cost["by_model"]:
        share = (f"; tokens out taken as {cost['output_share']:.0%} of tokens"
                 if cost["output_share"] is not None else "")
        print(f"  cost total: {cost['total']:,.2f}{share}")
    if cost["unpriced"]:
        print(f"  cost: no prices for {', '.join(cost['unpriced'])} (set price_in_per_mtok and "
              "price_out_per_mtok in a model table, or --prices FILE)")


def _print_power(row: dict) -> None:
    binary = row["design"] in ("two_proportions", "paired_binary")
    sizes = f"n = {row['n']:,}" + (f" + {row['n_other']:,}" if row["n_other"] else "")
    head = (f"  power, {row['contrast']} ({row['design']}, {sizes} {row['unit']}s per "
            f"{row['per']}; {row['assumptions']}, {row['source']}):")

    def effect_text(value: float) -> str:
        return f"{100 * value:.2f} percentage points" if binary else f"{value:.4g}"

    mde = row["mde"]
    text = "no effect is detectable at this n" if mde != mde else f"MDE {effect_text(mde)}"
    text += f" at {row['power']:.0%} power, alpha {row['alpha']:g}"
    if "n_needed" in row:
        effect = f"{100 * row['effect']:g} pp" if binary else f"{row['effect']:g}"
        text += f"; {effect} needs n = {row['n_needed']:,}"
    print(f"{head} {text}")
    # the normal approximation above; the test the report runs, computed exactly, below
    run = f"    as the report tests it ({row['test']}, exact power):"
    if mde == mde:
        run += f" {row['power_at_mde']:.1%} power at that MDE;"
    exact = row["mde_exact"]
    run += (f" {row['power']:.0%} power needs MDE {effect_text(exact)}" if exact == exact
            else f" no effect reaches {row['power']:.0%} power at this n")
    if "n_needed" in row:
        needed = row["n_needed_exact"]
        run += (f"; at n = {row['n_needed']:,} it has {row['power_at_n_needed']:.1%}, "
                + (f"and reaches {row['power']:.0%} at n = {needed:,}" if needed != math.inf
                   else "and never reaches it"))
    print(run)


TRACE_FORMATS = ("parquet", "jsonl")


def cmd_export(args) -> int:
    from biaslab.experiments.replay import load_run_plan, open_run

    from biaslab.experiments.interrupts import set_interrupt_hint

    out = Path(args.out) if args.out else Path(args.run_dir) / "export"
    set_interrupt_hint("the run is unchanged; export it again with the same command")
    store = open_run(args.run_dir)
    try:
        if args.format in TRACE_FORMATS:
            paths = store.export(out, fmt=args.format)
        else:
            from biaslab.experiments.reports import protocol_exports

            plan = load_run_plan(args.run_dir, check_keys=False)
            formats = protocol_exports(plan.protocol)
            if args.format not in formats:
                raise UserError(f"--format '{args.format}' is not a format of protocol "
                                f"'{plan.protocol.name}' (known: "
                                f"{', '.join([*TRACE_FORMATS, *formats])})")
            paths = formats[args.format](store, out, plan.options)
        for path in paths:
            print(f"wrote {path}")
    finally:
        store.close()
    return 0


def cmd_view(args) -> int:
    from biaslab.experiments.replay import open_run
    from biaslab.viewer import serve

    # One line if it is not a readable run; rows with damaged JSON are not refused here: the
    # viewer lists them marked damaged (biaslab.viewer.store_queries), which is how to see
    # what was damaged.
    open_run(args.run_dir, check_rows=False).close()
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {args.port}")
    serve(args.run_dir, args.port)
    return 0


_NO_FIGURES = "write tables and report.html without figures (faster; tables unchanged)"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="biaslab", description="Simulate LLM fairness protocols on LangGraph.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run an experiment spec")
    r.add_argument("spec", help="a spec file, or with --resume a run directory")
    r.add_argument("--model", help="replace the spec's model axis with this one model (nodes "
                   "bound to their own model keep it; the run says which)")
    r.add_argument("--all-nodes", action="store_true",
                   help="with --model: every node runs on that model, its own binding dropped")
    r.add_argument("--scale", help="a [scale.NAME] of the spec (smoke|paper; default paper)")
    r.add_argument("--out", help="run directory (default runs/<name>-<scale>)")
    r.add_argument("--resume", action="store_true", help="continue a run; done cells are kept")
    r.add_argument("--concurrency", type=int, help="maximum model calls in flight")
    r.add_argument("--lanes", type=int, help="cells per LangGraph invocation (default: up to "
                                             "16 for cells of 1-2 calls, up to 4 for bigger "
                                             "ones; results do not change)")
    r.add_argument("--no-cache", action="store_true", help="do not use the cross-run cache")
    r.add_argument("--no-report", action="store_true", help="skip tables and figures")
    r.add_argument("--no-figures", action="store_true", help=_NO_FIGURES)
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--workers", type=int, nargs="?", const=os.cpu_count() or 1,
                   help="run cells in N processes (alone: one per core), merged into one store "
                        "(default: one process; one per core for a large grid on scripted "
                        "models only, see docs/throughput.md)")
    r.add_argument("--shard", metavar="I/N", help="run only shard I of N of the grid into "
                                                   "--out (combine with biaslab merge)")
    r.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="where --workers shards run: local processes, or Ray tasks")
    r.add_argument("--ray-address", help="Ray cluster address (default $RAY_ADDRESS, else a "
                                         "local Ray instance)")
    r.set_defaults(func=cmd_run)

    mg = sub.add_parser("merge", help="combine shard runs of one experiment into one run")
    mg.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    mg.add_argument("--out", required=True, help="the combined run directory")
    mg.add_argument("--no-report", action="store_true", help="skip tables and figures")
    mg.add_argument("--no-figures", action="store_true", help=_NO_FIGURES)
    mg.add_argument("--allow-partial", action="store_true",
                    help="merge even when some shards of the split are missing (warns)")
    mg.set_defaults(func=cmd_merge)

    rep = sub.add_parser("report", help="write tables and figures of a run")
    rep.add_argument("run_dir")
    rep.add_argument("--no-figures", action="store_true", help=_NO_FIGURES)
    rep.set_defaults(func=cmd_report)

    rp = sub.add_parser("replay", help="rescore, strictly replay, or re-run with one change")
    rp.add_argument("run_dir")
    rp.add_argument("--mode", required=True, choices=["rescore", "strict", "counterfactual"])
    rp.add_argument("--out", help="directory for the replayed run; rescore: for its tables "
                    "(the run is then only read)")
    rp.add_argument("--node", help="counterfactual: the node to change")
    rp.add_argument("--prompt", help="counterfactual: the node's new prompt (id, id@variant, "
                                     "a .toml file, or @variant of the node's own prompts)")
    rp.add_argument("--model", help="counterfactual: the node's new model")
    rp.add_argument("--directions", nargs="+", help="counterfactual: exposure directions")
    rp.add_argument("--targets", nargs="+",
                    help="counterfactual: exposure targets: all, singletons, each_and_all, or "
                         "a list like prediction explanation+prediction")
    rp.add_argument("--position", choices=["system-append", "system-replace", "user-prefix",
                                           "user-suffix"],
                    help="counterfactual: where the exposure text goes")
    rp.add_argument("--template", help="counterfactual: the exposure template "
                                       "(e.g. exposures/covert_favor)")
    rp.add_argument("--mitigation", metavar="TEMPLATE",
                    help="counterfactual: add a mitigation arm at --node (a name under "
                         "prompts/mitigations/, e.g. fairness_reminder, a prompt id or a .toml "
                         "file); every arm runs with and without it")
    rp.add_argument("--swap-groups", nargs="?", const="default", metavar="LEXICON",
                    help="counterfactual: the judge-bias probe: --node (a+b for several) sees "
                         "its inputs with group terms swapped (he/she, women/men...), by the "
                         "packaged lexicon or a TOML file of pairs; writes "
                         "tables/judge_bias_probe.csv")
    rp.add_argument("--overrides", nargs="+", metavar="DIR",
                    help="counterfactual: prompt directories that shadow the run's prompts")
    rp.add_argument("--from-turn", type=int, metavar="K",
                    help="counterfactual: make the change from turn K on only (protocols with "
                         "turns); turns 1..K-1 are kept from the source run")
    rp.add_argument("--tools", choices=["replay", "live"],
                    help="counterfactual, audited app: what a tool call the source never made "
                         "does: fails the cell (replay) or runs (live); default: the spec's")
    rp.add_argument("--resume", action="store_true",
                    help="continue an interrupted replay in --out")
    rp.add_argument("--concurrency", type=int, help="maximum model calls in flight")
    rp.add_argument("--no-cache", action="store_true",
                    help="counterfactual: do not use the cross-run cache")
    rp.add_argument("--judge-node", help="rescore: judge this node's recorded answers")
    rp.add_argument("--judge-prompt", default="evaluators/group_tilt",
                    help="rescore: the judge's prompt (default evaluators/group_tilt)")
    rp.add_argument("--judges", nargs="+", help="rescore: judge models (k); with "
                    "--sensitivity, alternate judges added to the recorded panel (with "
                    "--judge-node: the panel itself, two or more)")
    rp.add_argument("--sensitivity", action="store_true",
                    help="rescore: the headline metrics under every judge configuration "
                         "(each judge alone, leave one out, majority, unanimity)")
    rp.add_argument("--repeats", type=int, help="rescore: answers per judge (r; default 1)")
    rp.add_argument("--labels", nargs="+", help="rescore: labels, if the prompt declares none")
    rp.add_argument("--eval-name", default="judge", help="rescore: evals/<name>/ directory")
    rp.add_argument("--quiet", action="store_true")
    rp.add_argument("--no-figures", action="store_true", help=_NO_FIGURES)
    rp.set_defaults(func=cmd_replay)

    bl = sub.add_parser("biaslens-released", help="score the BiasLens authors' released "
                        "answers with biaslab's oracles, against their script and counts")
    bl.add_argument("root", nargs="+", help="folders holding the origin's answers/ and "
                    "results/, or release tarballs (.tar.xz) of them")
    bl.add_argument("--model", nargs="+", help="released model folders (default: all)")
    bl.add_argument("--condition", nargs="+", default=["role"],
                    choices=["role", "without_role"])
    bl.add_argument("--out", help="write counts.csv, families.csv and Tables 3, 5, 6 here")
    bl.add_argument("--bank", help="the question bank the answers belong to (default: the "
                    "shipped BiasLens bank)")
    bl.set_defaults(func=cmd_biaslens_released)

    im = sub.add_parser("import", help="read recorded traffic into a run")
    im_sub = im.add_subparsers(dest="what", required=True)
    it = im_sub.add_parser("traces", help="OTLP JSON spans or LangSmith runs as a run whose "
                           "cells are the traced conversations (see docs/traces.md)")
    it.add_argument("file", help="an OTLP JSON, console-exporter or LangSmith run file")
    it.add_argument("--out", required=True, help="the run directory to write (must not exist)")
    it.add_argument("--group", help="the item key naming each trace's group")
    it.add_argument("--unit", help="the item key naming each trace's unit (default: id, else "
                    "the trace id)")
    it.add_argument("--outcome", help="a dotted path into the final output: the measure")
    it.add_argument("--since", help="only traces that began at or after this ISO date/time")
    it.add_argument("--until", help="only traces that began before this ISO date/time")
    it.add_argument("--tag", help="only traces whose root carries this tag")
    it.set_defaults(func=cmd_import_traces)
    ib = im_sub.add_parser("biaslens", help="the BiasLens authors' released answers and Why-judge "
                           "verdicts as a roleplay run (see docs/protocols/roleplay.md)")
    ib.add_argument("root", nargs="+", help="folders holding the origin's answers/, or release "
                    "tarballs (.tar.xz) of them")
    ib.add_argument("--out", required=True, help="the run directory to write (must not exist)")
    ib.add_argument("--model", nargs="+", help="released model folders (default: all)")
    ib.add_argument("--condition", nargs="+", choices=["role", "without_role"],
                    help="default: both")
    ib.add_argument("--bank", help="the question bank the answers belong to (default: the "
                    "shipped BiasLens bank)")
    ib.add_argument("--chunk-size", type=int, default=50, help="questions per cell (default 50)")
    ib.add_argument("--quiet", action="store_true")
    ib.set_defaults(func=cmd_import_biaslens)

    g = sub.add_parser("graph", help="print a protocol's Mermaid diagram")
    g.add_argument("protocol", help="a protocol name, or a spec file (.toml) naming one")
    g.add_argument("--variant", help="one variant only (e.g. E2)")
    g.add_argument("--plugins", nargs="+", help="protocol files (.py) or modules to load first")
    g.set_defaults(func=cmd_graph)

    pl = sub.add_parser("protocols", help="list protocols with their variants and LLM nodes")
    pl.add_argument("--plugins", nargs="+", help="protocol files (.py) or modules to load first")
    pl.add_argument("--spec", help="also load the protocol (and plugins) a spec names")
    pl.set_defaults(func=cmd_protocols)

    pr = sub.add_parser("prompts", help="list or show prompt templates")
    pr.add_argument("action", choices=["list", "show"])
    pr.add_argument("ref", nargs="?")
    pr.add_argument("--overrides", nargs="*", help="override directories")
    pr.set_defaults(func=cmd_prompts)

    e = sub.add_parser("estimate", help="cells, calls, tokens, wall time, cost and power "
                       "before anything runs")
    e.add_argument("spec")
    e.add_argument("--scale", help="one scale (default: paper and every [scale.NAME])")
    e.add_argument("--model")
    e.add_argument("--all-nodes", action="store_true")
    e.add_argument("--json", action="store_true")
    e.add_argument("--power", action="store_true",
                   help="the minimum detectable effect of each main contrast (80%% power, "
                   "alpha 0.05)")
    e.add_argument("--mde", type=float, metavar="EFFECT",
                   help="the sample size needed to detect this absolute effect (implies --power)")
    e.add_argument("--baseline", type=float,
                   help="assumed rate of a binary measure in the reference arm (default 0.5)")
    e.add_argument("--correlation", type=float, default=0.0,
                   help="assumed within-unit correlation of a paired 0/1 measure (default 0)")
    e.add_argument("--sd", type=float, default=0.5,
                   help="assumed SD of a per-unit change, numeric measures (default 0.5)")
    e.add_argument("--pilot", metavar="RUN_DIR",
                   help="read baseline, SD and correlation from a finished run instead")
    e.add_argument("--latency-s", type=float, default=None,
                   help="seconds per call for the wall time, for every model (default: by "
                        "provider: scripted 0, the embedded model as measured, hosted 2)")
    e.add_argument("--prices", metavar="FILE",
                   help="TOML: model label -> price_in_per_mtok, price_out_per_mtok")
    e.add_argument("--output-share", type=float, default=0.25,
                   help="share of tokens priced as output where a protocol does not split "
                   "them (default 0.25)")
    e.set_defaults(func=cmd_estimate)

    x = sub.add_parser("export", help="export a run's traces to Parquet or JSONL, or its data "
                       "in a protocol's own format (augmentation: --format bbq)")
    x.add_argument("run_dir")
    x.add_argument("--format", default="parquet",
                   help="parquet or jsonl (the traces), or a protocol's format (e.g. bbq)")
    x.add_argument("--out", help="output directory (default: RUN/export)")
    x.set_defaults(func=cmd_export)

    v = sub.add_parser("view", help="browse a run's cells, calls and dialogues in a local web UI")
    v.add_argument("run_dir")
    v.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765)")
    v.set_defaults(func=cmd_view)
    return p


def main(argv: list[str] | None = None) -> int:
    from biaslab.experiments.interrupts import ctrl_c_guard, set_interrupt_hint

    # Ctrl-C in every phase (planning, calls, report, export, view): the first stops the
    # command within a few seconds, a second at once; see interrupts.ctrl_c_guard.
    set_interrupt_hint(None)
    with ctrl_c_guard():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "concurrency", None) is not None and args.concurrency < 1:
            raise UserError(f"--concurrency must be at least 1, got {args.concurrency}")
        if getattr(args, "lanes", None) is not None and not 1 <= args.lanes <= 64:
            raise UserError(f"--lanes must be between 1 and 64, got {args.lanes}")
        if getattr(args, "workers", None) is not None and args.workers < 1:
            raise UserError(f"--workers must be at least 1, got {args.workers}")
        _refuse_meaningless(args)
        with _figures_setting(args), _fits_setting(args):
            code = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
        return code
    except UserError as exc:
        print(f"biaslab: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `biaslab graph ... | head`: the reader has what it wanted
        _drop_stdout()
        return 141  # 128 + SIGPIPE, what the shell reports for a command cut off by a pipe
    except sqlite3.DatabaseError as exc:  # a store that no earlier check opened
        print(f"biaslab: error: a run store could not be read ({exc})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C (or a plugin raising it) outside a run's own handling
        from biaslab.experiments.interrupts import (interrupt_hint_text, interrupted_by_signal,
                                                    quit_now)

        line = f"biaslab: interrupted{interrupt_hint_text()}"
        if interrupted_by_signal():  # end now: a normal exit would only wait (threads, pools)
            quit_now(line)
        print(line, file=sys.stderr)
        return 130


def _figures_setting(args):
    """``--no-figures``: every report this command writes has its tables and report.html but
    no figure (see biaslab.experiments.reports.figure_files)."""
    if not getattr(args, "no_figures", False):
        return contextlib.nullcontext()
    from biaslab.experiments.reports.figure_files import figures_off

    return figures_off()


def _fits_setting(args):
    """``--no-cache``: nothing this command does (its run and the report after it) reads or
    writes fitted results on disk (see biaslab.datasets.fit_cache)."""
    from biaslab.datasets.fit_cache import fits_on_disk

    return fits_on_disk(not getattr(args, "no_cache", False))


_POSITIONALS = {"spec": "SPEC", "run_dir": "RUN_DIR", "run_dirs": "RUN_DIR", "protocol":
                "PROTOCOL", "ref": "REF"}
_COUNTERFACTUAL_ONLY = ("node", "prompt", "model", "directions", "targets", "position",
                        "template", "mitigation", "swap_groups", "overrides", "from_turn",
                        "tools")


def _refuse_meaningless(args) -> None:
    """Flags that would be accepted and then do nothing, or something the user did not mean,
    are refused with one line before anything runs or is written."""
    for key, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            name = _POSITIONALS.get(key, "--" + key.replace("_", "-"))
            raise UserError(f"{name} is empty; give a value or leave it out")
    command = args.command
    if command == "run" and args.ray_address and args.executor != "ray":
        raise UserError("--ray-address goes with --executor ray (and --workers N); without it "
                        "the run would not use Ray at all")
    if command == "replay":
        if args.mode != "counterfactual":
            given = [k for k in _COUNTERFACTUAL_ONLY if getattr(args, k) is not None]
            if given:
                flag = "--" + given[0].replace("_", "-")
                raise UserError(f"{flag} goes with --mode counterfactual; --mode {args.mode} "
                                "would ignore it")
        if args.repeats is not None and args.repeats < 1:
            raise UserError(f"--repeats must be at least 1, got {args.repeats}")
        for flag, value in (("--repeats", args.repeats), ("--labels", args.labels)):
            if value is not None and not args.judge_node:
                raise UserError(f"{flag} goes with --mode rescore --judge-node NODE; without "
                                "it nothing is judged")
    if getattr(args, "no_figures", False) and (getattr(args, "no_report", False)
                                               or getattr(args, "mode", None) == "strict"):
        why = "--no-report" if getattr(args, "no_report", False) else "--mode strict"
        raise UserError(f"--no-figures goes with a report; {why} writes none")
    if command == "estimate" and args.pilot and not (args.power or args.mde is not None):
        raise UserError("--pilot goes with --power (or --mde): it reads the power "
                        "assumptions from a finished run")
    if command == "merge":
        seen: dict[Path, str] = {}
        for run_dir in args.run_dirs:
            resolved = Path(run_dir).resolve()
            if resolved in seen:
                raise UserError(f"{run_dir} is listed twice (as {seen[resolved]}); list each "
                                "run to merge once")
            seen[resolved] = run_dir
    _refuse_bad_out(args)


def _refuse_bad_out(args) -> None:
    """Every verb's ``--out`` by the same rules (`out_paths.check_out`), and ``--shard``'s
    needs, before any work."""
    from biaslab.experiments.out_paths import check_out

    command, out = args.command, getattr(args, "out", None)
    sources = [args.run_dir] if command == "replay" else \
        list(args.run_dirs) if command == "merge" else []
    check_out(out, sources=sources)
    if command == "run" and args.shard:
        if not out:
            raise UserError("--shard needs --out: each shard writes a directory of its own, "
                            "which biaslab merge combines")
        from biaslab.traces.store import STORE_FILE

        if args.resume and not (Path(out) / STORE_FILE).is_file():
            raise UserError(f"--resume: {out} holds no run of shard {args.shard} to continue; "
                            "leave out --resume to start it, or give the shard's directory")


def _drop_stdout() -> None:
    """Point stdout at /dev/null so that Python's own flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


if __name__ == "__main__":
    sys.exit(main())
