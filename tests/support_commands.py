"""Running a page's command blocks as printed (the README and every docs page): the blocks,
one logical line each, and the clean environment they run in (no API key, a fresh cache and
home, the suite's virtual environment reached only through `. .venv/bin/activate`)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

__all__ = ["commands", "clean_env", "HOSTED", "VENV"]

VENV = Path(sys.prefix)  # the virtual environment the suite runs in (.venv under make)
HOSTED = re.compile(r"#\s*needs\s+([A-Z][A-Z0-9_]*_API_KEY)\s*$")


def commands(text: str) -> list[str]:
    """A page's ``bash`` blocks as logical command lines (continuations joined)."""
    out: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        pending = ""
        for line in block.splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            line = pending + line
            pending = ""
            if line.strip():
                out.append(line.strip())
    return out


def clean_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not (k.endswith("_API_KEY") or k.endswith("_BASE_URL") or k == "VIRTUAL_ENV")}
    env.update(HOME=str(tmp), BIASLAB_CACHE=str(tmp / "cache.sqlite"), COLUMNS="100")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(p).resolve() != (VENV / "bin").resolve())
    return env
