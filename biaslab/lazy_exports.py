"""Package re-exports that load their module on first use (PEP 562).

Why: every `biaslab` command imports some module of `experiments`, `traces`, `datasets` or
`evaluators`, and a package ``__init__`` that imported all it re-exports would load the
planner, LangGraph, pandas, scipy... at the start of each one (issue 48). Such a package
names where each export lives and takes its ``__getattr__`` and ``__dir__`` from here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Mapping[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(``__getattr__``, ``__dir__``) for `package`, whose names in ``homes[module]`` come
    from its submodule `module`; a name is looked up once, then kept in the package."""
    module_of = {name: module for module, names in homes.items() for name in names}
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *module_of})

    return __getattr__, __dir__
