"""The typed records a run writes. Versioned, so old stores can be read after changes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["CallRecord", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1


class CallRecord(BaseModel):
    """One model call, as seen by the node that made it."""

    cell_id: str
    """The grid cell the call belongs to."""
    node: str
    """Graph node that made the call (its prompt, model and exposures are bound by this name)."""
    item: str = ""
    """Which sub-call of the node: a batch, a record, a turn (empty for single-call nodes)."""
    sample: int = 0
    """Repeat index for k-repeat answers; part of the cache key."""
    attempt: int = 0
    """Re-ask index after a parse failure (0 = first ask)."""
    seed: int = 0
    """The cell's seed, passed to the model."""
    exposure_id: str = "none"
    """Condition id of the exposures applied to this call's prompt ('none' when clean)."""
    exposed: bool = False
    """Whether this very call's prompt carried exposure text."""
    exposure_prompts: list[str] = Field(default_factory=list)
    """Template id@hash of each exposure text injected into this call."""
    prompt_id: str = ""
    """Prompt template id with variant."""
    prompt_hash: str = ""
    """Hash of the template's content."""
    prompt_source: str = ""
    """The template file the prompt came from (``biaslab:<path>`` for a packaged one), so a
    shadowed prompt says which file shadowed it."""
    cache_key: str = ""
    """Content address of the call: model identity, messages, params, seed and sample."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The rendered messages sent to the model (``role`` and ``content``; an audited app's
    also ``tool_calls`` and ``tool_call_id``, in OpenAI's chat shape)."""
    model: dict[str, Any] = Field(default_factory=dict)
    """Model spec without secrets."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Sampling parameters, seed and output constraint."""
    raw: str | None = None
    """The model's text, or None when the call failed."""
    parsed: Any = None
    """The parsed value when parsing succeeded."""
    parse_error: str | None = None
    """Why parsing failed; the value is then excluded and counted, never imputed."""
    error: str | None = None
    """Why the call itself failed after retries."""
    input_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    """Wall time of the model call (0 for cache hits)."""
    attempts: int = 0
    """Transport attempts (retries included); 0 for cache hits."""
    attempt_errors: list[str] = Field(default_factory=list)
    """What each failed transport attempt met, one line each in order ('attempt 1: HTTP 503
    InternalServerError: ...'): retried failures before the answer, or, when `error` is set,
    every attempt up to the last. Empty for a first-try answer and for cache hits."""
    cache_hit: bool = False
    """Whether the response came from a cache or a replayed trace instead of a model."""
    group_swap: str = ""
    """The lexicon (``name@hash``) whose group terms were swapped in this call's inputs (the
    judge-bias probe, ``--swap-groups``); empty when the inputs are as the graph gave them."""
    swapped_terms: int = 0
    """How many group terms the swap replaced in this call's inputs (0: the text had none, so
    the call asks exactly what the source asked)."""
