"""Experiment specs: TOML files loaded into pydantic models, with named scales.

A spec names a protocol, the model axis, seeds, which exposure arms to generate, per-node
prompt/model bindings, and protocol options. ``[scale.<name>]`` tables hold partial overrides
(e.g. ``smoke``) applied with ``--scale``; the unscaled spec is the ``paper`` scale.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from biaslab.errors import UserError

__all__ = ["ExperimentSpec", "RunSettings", "ConditionSettings", "NodeSettings", "load_spec",
           "spec_from_dict"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunSettings(_Strict):
    seeds: list[int] = Field(default=[42], min_length=1)
    """Replicate seeds: they pick the data split and are passed to every model call."""
    concurrency: int = Field(default=4, ge=1, le=1024)
    """Maximum model calls in flight."""
    max_attempts: int = Field(default=5, ge=1, le=20)
    """Transport attempts per call for transient errors (timeouts, 429, 5xx)."""
    retry_base_s: float = Field(default=0.5, ge=0)
    """First backoff step; doubles per attempt, with full jitter."""


class ConditionSettings(_Strict):
    directions: list[str] | None = None
    """Exposure directions; default: all the protocol defines."""
    targets: str | list[str] = "all"
    """'all' (every non-empty subset of LLM nodes), 'singletons', 'each_and_all', or a list
    like ["prediction", "explanation+prediction"]."""
    template: str = "exposures/covert_favor"
    position: Literal["system-append", "system-replace", "user-prefix", "user-suffix"] = \
        "system-append"
    include_clean: bool = True


class NodeSettings(_Strict):
    prompt: str | None = None
    """Prompt id, id@variant, or a path to a .toml template."""
    model: str | None = None
    """A model for this node only (e.g. a fixed judge), as a spec string or alias."""


class ExperimentSpec(_Strict):
    name: str
    protocol: str
    description: str = ""
    models: list[str] = Field(default=["local"], min_length=1)
    """The grid's model axis: spec strings (local, openrouter:..., ...) or alias names."""
    model_aliases: dict[str, dict[str, Any]] = {}
    """Named model tables: provider, model, base_url, api_key_env, temperature, rps..."""
    run: RunSettings = RunSettings()
    conditions: ConditionSettings = ConditionSettings()
    nodes: dict[str, NodeSettings] = {}
    prompt_overrides: list[str] = []
    """Directories laid out like biaslab/prompts whose templates shadow the packaged ones."""
    options: dict[str, Any] = {}
    """Protocol options, validated by the protocol."""
    scale: dict[str, dict[str, Any]] = {}
    """Named partial overrides, e.g. [scale.smoke]."""
    scale_applied: str = "paper"


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _first_error(exc: ValidationError, where: str) -> UserError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    value = err.get("input")
    shown = f" (got {value!r})" if not isinstance(value, dict) else ""
    return UserError(f"{where}: {loc}: {err['msg']}{shown}")


def spec_from_dict(data: dict[str, Any], *, scale: str | None = None, where: str = "spec"
                   ) -> ExperimentSpec:
    """Validate a spec dict, applying ``[scale.<scale>]`` when asked."""
    if scale and scale != "paper":
        scales = data.get("scale", {})
        if scale not in scales:
            raise UserError(f"{where}: no [scale.{scale}] table (scales here: "
                            f"{', '.join(['paper', *scales]) })")
        data = _merge({k: v for k, v in data.items() if k != "scale"}, scales[scale])
        data["scale"] = scales
        data["scale_applied"] = scale
    try:
        return ExperimentSpec(**data)
    except ValidationError as exc:
        raise _first_error(exc, where) from None


def load_spec(path: str | Path, *, scale: str | None = None) -> ExperimentSpec:
    """Read a TOML spec; every problem is one line naming the file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"spec not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read spec {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"spec {path} is not valid TOML: {exc}") from None
    spec = spec_from_dict(data, scale=scale, where=str(path))
    # Paths in a spec are relative to the spec file, so a run can be replayed from anywhere.
    base = path.parent

    def resolve(value: str) -> str:
        return value if Path(value).is_absolute() else str((base / value).resolve())

    spec.prompt_overrides[:] = [resolve(d) for d in spec.prompt_overrides]
    for node in spec.nodes.values():
        if node.prompt and node.prompt.endswith(".toml"):
            node.prompt = resolve(node.prompt)
    if isinstance(spec.options.get("data_dir"), str):
        spec.options["data_dir"] = resolve(spec.options["data_dir"])
    return spec
