"""One line describing the machine a bench ran on, for bench/results.md."""

from __future__ import annotations

import os
import platform
from importlib import metadata

__all__ = ["describe"]


def describe(packages: tuple[str, ...] = ()) -> str:
    """Cores, CPU model, OS, Python and the versions of `packages`."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = "".join(f", {p} {metadata.version(p)}" for p in packages)
    return (f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}{versions}")
