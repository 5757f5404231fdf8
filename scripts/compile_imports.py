"""Compile what biaslab imports, once, at `make setup` (run with bytecode writing on).

Why: setup does not compile every installed module (uv's --compile-bytecode compiled ~15,000,
most never imported; see the Makefile). Where PYTHONDONTWRITEBYTECODE is set, a command run by
hand after `make setup` would otherwise compile each module it imports from source, every
time. Importing every biaslab module here, and the libraries its commands import lazily, writes
their bytecode (~2,900 modules, ~5-10 s on 2 cores). A module that cannot be
imported here (an optional dependency missing) is skipped: it is compiled where it is used.

Two processes share the work, one for biaslab's own modules and one for the libraries it
imports lazily, so that both cores compile (each is a chain of imports, one module at a time);
a module both reach is written by whichever gets there first (Python writes bytecode files
whole, by renaming).
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

# Imported inside functions by reports, evaluators, exports and the embedded model.
LAZY = ("matplotlib.backends.backend_agg", "matplotlib.backends.backend_svg",
        "statsmodels.stats.proportion", "statsmodels.stats.contingency_tables",
        "statsmodels.stats.multitest", "scipy.stats", "sklearn.model_selection",
        "sklearn.ensemble", "sklearn.linear_model", "fairlearn.metrics", "pyarrow.parquet",
        "xllamacpp")


def _import_all(names) -> int:
    """Import each module of `names`; how many could not be."""
    skipped = 0
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # an optional dependency: compiled where it is used
            skipped += 1
    return skipped


def main() -> int:
    if sys.dont_write_bytecode:
        print("compile_imports: bytecode writing is off (PYTHONDONTWRITEBYTECODE); nothing to do",
              file=sys.stderr)
        return 0
    if sys.argv[1:] == ["--lazy"]:
        return min(_import_all(LAZY), 100)  # the count, as the exit status
    libraries = subprocess.Popen([sys.executable, __file__, "--lazy"])
    import biaslab

    names = [m.name for m in pkgutil.walk_packages(biaslab.__path__, "biaslab.",
                                                   onerror=lambda name: None)
             if not m.name.endswith("__main__")]
    skipped = _import_all(names)
    code = libraries.wait()
    skipped += code if code >= 0 else len(LAZY)  # killed: none counted as compiled
    print(f"compiled the imports of {len(names)} biaslab modules and {len(LAZY)} libraries "
          f"({skipped} skipped)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
