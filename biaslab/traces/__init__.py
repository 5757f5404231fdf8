"""Traces: the run store, the response cache and the typed records of every call."""

import importlib

# Resolved on first use (PEP 562): the response cache (every model call's path) must not pull
# in the run store and with it pandas (~0.5 s at the start of every `biaslab` command).
_HOME = {
    "cache": ("CachedResponse", "CallCache", "cache_key"),
    "records": ("CallRecord",),
    "store": ("RunStore",),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_MODULE_OF})


__all__ = ["CachedResponse", "CallCache", "CallRecord", "RunStore", "cache_key"]
