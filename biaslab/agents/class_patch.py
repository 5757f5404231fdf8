"""Methods of a library class replaced while an audited cell runs, and put back after.

The app audit answers an app's model calls and tool calls by replacing methods on the classes
every such call ends in (LangChain's ``BaseChatModel`` and ``BaseTool``). Cells of one run
overlap, in tasks and in threads, so the replacement is reference-counted: the first cell to
start installs it, the last to end removes it, and nothing stays patched once no cell runs.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

__all__ = ["ClassPatch"]


class ClassPatch:
    """Replace `replacements` (method name → function) on `cls` while at least one user holds
    the patch. A name the class does not define itself (another library version) is left
    alone. `original` holds the replaced methods while the patch is on."""

    def __init__(self, cls: type, replacements: Mapping[str, Callable[..., Any]]):
        self.cls = cls
        self.replacements = dict(replacements)
        self.original: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._users = 0

    def install(self) -> None:
        with self._lock:
            if self._users == 0:
                for name, fn in self.replacements.items():
                    if name in self.cls.__dict__:
                        self.original[name] = self.cls.__dict__[name]
                        setattr(self.cls, name, fn)
            self._users += 1

    def uninstall(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for name, fn in self.original.items():
                    setattr(self.cls, name, fn)
                self.original.clear()
