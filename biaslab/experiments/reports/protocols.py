"""The built-in protocols' report writers, found by protocol name.

Graph modules sit below the experiments layer and never import it, so a built-in protocol's
tables, headline and counterfactual comparison are looked up here by the protocol's name. A
protocol of your own keeps them as methods (`Protocol.report`, `headline`, `compare`), which
are used when no built-in writer is registered.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pandas as pd

from biaslab.graphs.registry import Protocol

__all__ = ["protocol_report", "protocol_prepare", "protocol_headline", "protocol_compare",
           "protocol_exports", "protocol_headline_tables"]

# protocol name → (module under biaslab.experiments.reports, report fn, headline fn, compare fn)
_BUILT_IN: dict[str, tuple[str, str, str | None, str | None]] = {
    "amplification": ("amplification", "write_report", "headline", None),
    "roleplay": ("roleplay", "write_report", "headline", None),
    "roleplay_generate": ("roleplay", "write_generation_report", None, None),
    "multiturn": ("multiturn", "write_report", "headline", None),
    "augmentation": ("augmentation", "write_report", None, None),
}
_COMPARE: dict[str, tuple[str, str]] = {"amplification": ("compare", "compare_amplification"),
                                        "augmentation": ("augmentation",
                                                         "compare_augmentation")}
# protocol name → (module, function(store, run_dir, options) -> inputs with a close()): work a
# report starts before the generic tables, to run behind them (multiturn: embedding its texts)
_PREPARE: dict[str, tuple[str, str]] = {"multiturn": ("multiturn", "prepare_report")}
# protocol name → (module, function(store, run_dir, options) -> paths): only the files its
# headline tables are read from (judge sensitivity's re-derived configurations)
_HEADLINE_TABLES: dict[str, tuple[str, str]] = {"roleplay": ("roleplay",
                                                             "write_headline_tables")}
# protocol name → {export format → (module, function(store, out_dir, options) -> paths)}
_EXPORTS: dict[str, dict[str, tuple[str, str]]] = {
    "augmentation": {"bbq": ("augmentation", "export_bbq")}}


def _builtin(proto: Protocol) -> tuple | None:
    """Only the packaged protocol of that name; a user's protocol keeps its own methods."""
    if not type(proto).__module__.startswith("biaslab.graphs."):
        return None
    return _BUILT_IN.get(proto.name)


def _function(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"biaslab.experiments.reports.{module}"), name)


def protocol_prepare(proto: Protocol, store, run_dir: Path, options) -> Any | None:
    """What a built-in protocol's report starts before the generic tables (None for most);
    pass it to `protocol_report`, and close it when the report is done or has failed."""
    if _builtin(proto) is None or proto.name not in _PREPARE:
        return None
    return _function(*_PREPARE[proto.name])(store, run_dir, options)


def protocol_report(proto: Protocol, store, run_dir: Path, options, prepared: Any = None
                    ) -> list[Path]:
    """The protocol's own tables and figures (`prepared`: `protocol_prepare`'s result)."""
    entry = _builtin(proto)
    if entry is None:
        return list(proto.report(store, run_dir, options))
    if prepared is None:
        return list(_function(entry[0], entry[1])(store, run_dir, options))
    return list(_function(entry[0], entry[1])(store, run_dir, options, prepared=prepared))


def protocol_headline_tables(proto: Protocol, store, run_dir: Path, options) -> list[Path]:
    """The protocol's tables its headline rows (`Protocol.headline_tables`) are read from:
    a built-in protocol's quick writer of just those where it has one, else its whole
    report."""
    if _builtin(proto) is not None and proto.name in _HEADLINE_TABLES:
        return list(_function(*_HEADLINE_TABLES[proto.name])(store, run_dir, options))
    return protocol_report(proto, store, run_dir, options)


def protocol_headline(proto: Protocol, run_dir: Path) -> pd.DataFrame | None:
    """The table `biaslab report` prints, if the protocol has one."""
    entry = _builtin(proto)
    if entry is None or entry[2] is None:
        return proto.headline(run_dir)
    return _function(entry[0], entry[2])(run_dir)


def protocol_compare(proto: Protocol, source, counterfactual, out_dir: Path, options
                     ) -> list[Path]:
    """A counterfactual against its source, beyond the generic call comparison."""
    if _builtin(proto) is not None:
        found = _COMPARE.get(proto.name)
        return list(_function(*found)(source, counterfactual, out_dir, options)) if found else []
    hook = getattr(proto, "compare", None)
    return list(hook(source, counterfactual, out_dir, options)) if callable(hook) else []


def protocol_exports(proto: Protocol) -> dict[str, Any]:
    """Export formats of a protocol beyond the trace's own (``biaslab export --format``):
    format name → ``fn(store, out_dir, options) -> list of paths``. A protocol of your own
    declares them with `Protocol.exports`."""
    if _builtin(proto) is not None:
        return {fmt: _function(*where) for fmt, where in _EXPORTS.get(proto.name, {}).items()}
    return dict(proto.exports())
