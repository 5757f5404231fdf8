"""Traces: the run store, the response cache and the typed records of every call."""
from biaslab.traces.cache import CachedResponse, CallCache, cache_key
from biaslab.traces.records import CallRecord
from biaslab.traces.store import RunStore

__all__ = ["CachedResponse", "CallCache", "CallRecord", "RunStore", "cache_key"]
