"""The architecture as a rule: a lower layer never imports a higher one, and no ``_private``
name crosses a subpackage. Read from the source (every import, also inside functions), so a
lazy import cannot hide a circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "biaslab"
# Lower number = lower layer. A module may import its own layer and the layers below it.
LAYERS = {"errors": 0, "lazy_exports": 0, "traces": 1, "prompts": 1, "datasets": 1, "agents": 2,
          "evaluators": 3, "graphs": 4, "experiments": 5, "viewer": 6, "cli": 7,
          "__main__": 8, "__init__": 7, "api": 7, "console": 8}


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "biaslab" and len(parts) > 1 else None


def _imports(path: Path):
    """(imported module, imported names) for every import statement in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            yield node.args[0].value, []  # importlib.import_module("biaslab.graphs")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        own = rel.parts[0].removesuffix(".py")
        yield path, own


def test_every_subpackage_has_a_layer():
    assert {own for _, own in _modules()} <= set(LAYERS)


def test_no_lower_layer_imports_a_higher_one():
    wrong = []
    for path, own in _modules():
        for module, _ in _imports(path):
            other = _subpackage(module)
            if other is not None and other in LAYERS and LAYERS[other] > LAYERS[own]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert wrong == []


def test_no_private_name_crosses_a_subpackage():
    wrong = []
    for path, own in _modules():
        for module, names in _imports(path):
            other = _subpackage(module)
            if other is None or other == own:
                continue
            private = [n for n in names if n.startswith("_")]
            private += [p for p in module.split(".")[2:] if p.startswith("_") and p != "__init__"]
            if private:
                wrong.append(f"{path.relative_to(PACKAGE)}: {module} {private}")
    assert wrong == []
