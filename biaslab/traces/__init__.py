"""Traces: the run store, the response cache and the typed records of every call."""

from biaslab.lazy_exports import lazy_exports

# Resolved on first use (PEP 562): the response cache (every model call's path) must not pull
# in the run store and with it pandas (~0.5 s at the start of every `biaslab` command).
__getattr__, __dir__ = lazy_exports(__name__, {
    "cache": ("CachedResponse", "CallCache", "cache_key"),
    "records": ("CallRecord",),
    "store": ("RunStore",),
})


__all__ = ["CachedResponse", "CallCache", "CallRecord", "RunStore", "cache_key"]
