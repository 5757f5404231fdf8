"""The ``biaslab`` command line. Bad input → one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import asyncio
import json
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
    from biaslab.experiments.runner import run_plan
    from biaslab.experiments.spec import load_spec
    from biaslab.traces.store import RunStore

    spec = load_spec(args.spec, scale=args.scale)
    plan = make_plan(spec, models=[args.model] if args.model else None)
    out = Path(args.out) if args.out else _default_out(spec.name, spec.scale_applied)
    print(f"biaslab: {plan.n_cells()} cells → {out}", file=sys.stderr)
    try:
        result = asyncio.run(run_plan(plan, out, resume=args.resume, concurrency=args.concurrency,
                                      use_shared_cache=not args.no_cache,
                                      progress=not args.quiet))
    except KeyboardInterrupt:
        print(f"interrupted; finished cells are kept. Continue with: biaslab run {args.spec} "
              f"--out {out} --resume", file=sys.stderr)
        return 130
    print(result.summary(), file=sys.stderr)
    if result.cells_failed:
        store = RunStore(out, readonly=True)
        failed = store.cells().query("status == 'error'")
        store.close()
        for _, cell in failed.head(3).iterrows():
            print(f"  failed: {cell['cell_id']}: {cell['error']}", file=sys.stderr)
        print(f"  fix the cause, then: biaslab run {args.spec} --out {out} --resume",
              file=sys.stderr)
    if result.interrupted:
        print(f"continue with: biaslab run {args.spec} --out {out} --resume", file=sys.stderr)
        return 130
    if not args.no_report:
        store = RunStore(out, readonly=True)
        try:
            written = plan.protocol.report(store, out, plan.options)
        finally:
            store.close()
        for path in written:
            print(f"  wrote {path}")
    return 1 if result.cells_failed else 0


def cmd_report(args) -> int:
    from biaslab.experiments.replay import rescore

    for path in rescore(args.run_dir):
        print(f"wrote {path}")
    return 0


def cmd_replay(args) -> int:
    from biaslab.experiments import replay

    if args.mode == "rescore":
        if args.judge_node:
            return _judge_traces(args)
        for path in replay.rescore(args.run_dir):
            print(f"wrote {path}")
        return 0
    out = Path(args.out) if args.out else Path(f"{args.run_dir.rstrip('/')}-{args.mode}")
    if args.mode == "strict":
        result, diff = replay.strict_replay(args.run_dir, out, progress=not args.quiet)
        print(result.summary(), file=sys.stderr)
        if diff.identical:
            print(f"strict replay: {diff.compared} node outputs identical, "
                  f"{result.counters.model_calls} model calls")
            return 0
        print(f"strict replay: {len(diff.different)} outputs differ, {len(diff.missing)} missing "
              f"(first: {(diff.different or diff.missing)[0]})")
        return 1
    if not args.node and not (args.directions or args.targets):
        raise UserError("replay --mode counterfactual needs --node with --prompt or --model, "
                        "or --directions/--targets")
    result = replay.counterfactual(args.run_dir, out, node=args.node or "", prompt=args.prompt,
                                   model=args.model, directions=args.directions,
                                   targets=args.targets, progress=not args.quiet)
    print(result.summary(), file=sys.stderr)
    print(f"counterfactual run in {out}: {result.counters.model_calls} model calls, "
          f"{result.counters.cache_hits} answered from the trace or cache")
    return 1 if result.cells_failed else 0


def _judge_traces(args) -> int:
    from biaslab.evaluators.over_traces import judge_traces

    if not args.judges:
        raise UserError("--judge-node needs --judges MODEL [MODEL ...]")
    result = judge_traces(args.run_dir, node=args.judge_node, prompt=args.judge_prompt,
                          judges=args.judges, repeats=args.repeats, labels=args.labels,
                          name=args.eval_name)
    scores = result.scores
    print(f"judged {len(scores)} recorded '{args.judge_node}' answers with {len(args.judges)} "
          f"judge(s) x {args.repeats}: {result.judge_calls} judge calls, 0 target calls")
    if len(scores):
        print(scores.groupby(["target", "direction"])["label"].value_counts().to_string())
        print(f"wrote {result.eval_dir / 'scores.csv'}")
    return 0


def cmd_graph(args) -> int:
    from biaslab.graphs.registry import get_protocol

    proto = get_protocol(args.protocol)
    variants = proto.variants(proto.Options())
    chosen = [args.variant] if args.variant else variants
    for variant in chosen:
        if variant not in variants:
            raise UserError(f"protocol '{args.protocol}' has no variant '{variant}' "
                            f"(variants: {', '.join(variants)})")
        if len(chosen) > 1:
            print(f"%% {args.protocol} {variant}")
        print(proto.build(variant).compile().get_graph().draw_mermaid())
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
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.spec import load_spec

    spec = load_spec(args.spec, scale=args.scale)
    plan = make_plan(spec, models=[args.model] if args.model else None, check_keys=False)
    cells = calls = tokens = 0
    per_variant = {}
    for cell in plan.cells():
        est = plan.protocol.estimate(cell.variant, cell.item, plan.options)
        cells += 1
        calls += est["calls"]
        tokens += est["tokens"]
        v = per_variant.setdefault(cell.variant, [0, 0, 0])
        v[0] += 1
        v[1] += est["calls"]
        v[2] += est["tokens"]
    report = {"spec": spec.name, "scale": spec.scale_applied, "cells": cells,
              "calls_upper_bound": int(calls), "tokens_upper_bound": int(tokens),
              "by_variant": {k: {"cells": a, "calls": int(b), "tokens": int(c)}
                             for k, (a, b, c) in per_variant.items()}}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{spec.name} ({spec.scale_applied}): {cells} cells, at most {int(calls)} model "
              f"calls and {int(tokens)} tokens (before cache hits)")
        for k, (a, b, c) in per_variant.items():
            print(f"  {k}: {a} cells, ≤{int(b)} calls, ≤{int(c)} tokens")
    return 0


def cmd_export(args) -> int:
    from biaslab.experiments.replay import _open_source

    store = _open_source(args.run_dir)
    try:
        for path in store.export(Path(args.run_dir) / "export", fmt=args.format):
            print(f"wrote {path}")
    finally:
        store.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="biaslab", description="Simulate LLM fairness protocols on LangGraph.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run an experiment spec")
    r.add_argument("spec")
    r.add_argument("--model", help="replace the spec's model axis with this one model")
    r.add_argument("--scale", default="paper", help="a [scale.NAME] of the spec (smoke|paper)")
    r.add_argument("--out", help="run directory (default runs/<name>-<scale>)")
    r.add_argument("--resume", action="store_true", help="continue a run; done cells are kept")
    r.add_argument("--concurrency", type=int, help="maximum model calls in flight")
    r.add_argument("--no-cache", action="store_true", help="do not use the cross-run cache")
    r.add_argument("--no-report", action="store_true", help="skip tables and figures")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_run)

    rep = sub.add_parser("report", help="write tables and figures of a run")
    rep.add_argument("run_dir")
    rep.set_defaults(func=cmd_report)

    rp = sub.add_parser("replay", help="rescore, strictly replay, or re-run with one change")
    rp.add_argument("run_dir")
    rp.add_argument("--mode", required=True, choices=["rescore", "strict", "counterfactual"])
    rp.add_argument("--out", help="directory for the replayed run")
    rp.add_argument("--node", help="counterfactual: the node to change")
    rp.add_argument("--prompt", help="counterfactual: the node's new prompt")
    rp.add_argument("--model", help="counterfactual: the node's new model")
    rp.add_argument("--directions", nargs="+", help="counterfactual: exposure directions")
    rp.add_argument("--targets", nargs="+", help="counterfactual: exposure targets (a+b ...)")
    rp.add_argument("--judge-node", help="rescore: judge this node's recorded answers")
    rp.add_argument("--judge-prompt", default="evaluators/group_tilt",
                    help="rescore: the judge's prompt (default evaluators/group_tilt)")
    rp.add_argument("--judges", nargs="+", help="rescore: judge models (k)")
    rp.add_argument("--repeats", type=int, default=1, help="rescore: answers per judge (r)")
    rp.add_argument("--labels", nargs="+", help="rescore: labels, if the prompt declares none")
    rp.add_argument("--eval-name", default="judge", help="rescore: evals/<name>/ directory")
    rp.add_argument("--quiet", action="store_true")
    rp.set_defaults(func=cmd_replay)

    g = sub.add_parser("graph", help="print a protocol's Mermaid diagram")
    g.add_argument("protocol")
    g.add_argument("--variant", help="one variant only (e.g. E2)")
    g.set_defaults(func=cmd_graph)

    pr = sub.add_parser("prompts", help="list or show prompt templates")
    pr.add_argument("action", choices=["list", "show"])
    pr.add_argument("ref", nargs="?")
    pr.add_argument("--overrides", nargs="*", help="override directories")
    pr.set_defaults(func=cmd_prompts)

    e = sub.add_parser("estimate", help="cells, calls and tokens before anything runs")
    e.add_argument("spec")
    e.add_argument("--scale", default="paper")
    e.add_argument("--model")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_estimate)

    x = sub.add_parser("export", help="export a run's traces to Parquet or JSONL")
    x.add_argument("run_dir")
    x.add_argument("--format", choices=["parquet", "jsonl"], default="parquet")
    x.set_defaults(func=cmd_export)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "concurrency", None) is not None and args.concurrency < 1:
            raise UserError(f"--concurrency must be at least 1, got {args.concurrency}")
        return args.func(args)
    except UserError as exc:
        print(f"biaslab: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
