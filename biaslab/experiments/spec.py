"""Experiment specs: TOML files loaded into pydantic models, with named scales.

A spec names a protocol, the model axis, seeds, which exposure arms to generate, per-node
prompt/model bindings, and protocol options. ``[scale.<name>]`` tables hold partial overrides
(e.g. ``smoke``) applied with ``--scale``; the unscaled spec is the ``paper`` scale.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictInt, ValidationError,
                      field_validator)

from biaslab.errors import UserError

__all__ = ["ExperimentSpec", "RunSettings", "ConditionSettings", "NodeSettings", "FromTurn",
           "MitigationSettings", "SwapGroups",
           "load_spec", "refuse_imported_protocol", "IMPORTED_PROTOCOL",
           "spec_from_dict", "read_toml", "looks_secret"]

MAX_SEED = 2**32 - 1
"""Seeds go to numpy and to model endpoints, which take unsigned 32-bit values."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Key names whose values are credentials: such a value is never echoed in an error message.
_SECRET_KEY = re.compile(r"(api_?key|apikey|key|token|access_token|auth_token|bearer_token|"
                         r"secret|client_secret|secret_key|password|passwd|credentials?"
                         r"|.+_(api_?key|password|secret))", re.I)


def looks_secret(name: str) -> bool:
    """Whether a key name (``api_key``, ``token``, ``password``...) names a credential."""
    return bool(_SECRET_KEY.fullmatch(str(name).replace("-", "_")))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RunSettings(_Strict):
    seeds: list[Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]] = Field(default=[42],
                                                                       min_length=1)
    """Replicate seeds: they pick the data split and are passed to every model call."""
    concurrency: int = Field(default=4, ge=1, le=1024)
    """Maximum model calls in flight."""
    max_attempts: int = Field(default=8, ge=1, le=20)
    """Transport attempts per call for transient errors (timeouts, 429, 5xx)."""
    retry_base_s: float = Field(default=0.5, ge=0)
    """First backoff step; doubles per attempt (up to 30 s), half of each wait fixed and half
    random. A call gives up only after waiting at least half the steps' sum: 30.75 s with the
    defaults, so an outage shorter than that fails no call (`RetryPolicy.min_total_wait_s`)."""
    lanes: int | None = Field(default=None, ge=1, le=64)
    """Cells run side by side in one LangGraph invocation (`biaslab.graphs.lanes`); default:
    4x the concurrency, at most 64, for cells of up to two calls; the concurrency, at most 4,
    for bigger ones; 1 at concurrency 1 (`biaslab.experiments.runner.packing`). 1 runs every
    cell in its own invocation. Results do not depend on it."""


class ConditionSettings(_Strict):
    directions: list[str] | None = None
    """Exposure directions; default: all the protocol defines."""
    targets: str | list[str] = "all"
    """'all' (every non-empty subset of LLM nodes), 'singletons', 'each_and_all', or a list
    like ["prediction", "explanation+prediction"]."""
    template: str | None = None
    """The exposure text's template; default: the protocol's own, else exposures/covert_favor."""
    position: Literal["system-append", "system-replace", "user-prefix", "user-suffix"] = \
        "system-append"
    include_clean: bool = True

    @field_validator("directions")
    @classmethod
    def _some_directions(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("is empty: list at least one direction, or leave 'directions' out "
                             "to use every direction the protocol defines")
        return value


class MitigationSettings(_Strict):
    """One ``[mitigations.<name>]`` table: a debiasing instruction and the nodes that hear it.
    Each target set is one mitigation arm, crossed with every exposure arm (clean included)."""

    targets: str | list[str]
    """The nodes that receive it: a node, ``"a+b"``, a list of those, or 'all', 'singletons',
    'each_and_all' as for exposures."""
    template: str | None = None
    """Prompt id of its text; default ``mitigations/<name>``."""
    position: Literal["system-append", "system-replace", "user-prefix", "user-suffix",
                      "after-answer"] | None = None
    """Where its text goes; ``after-answer`` asks it after the node's answer (a self-check
    re-ask, whose answer is the node's value). None: the template's own ``position``
    (``mitigations/self_check`` says ``after-answer``), else ``system-append``."""
    slots: dict[str, str] = {}
    """Values for the template's slots, if it has any."""


class NodeSettings(_Strict):
    prompt: str | None = None
    """Prompt id, id@variant, or a path to a .toml template."""
    model: str | None = None
    """A model for this node only (e.g. a fixed judge), as a spec string or alias."""


class FromTurn(_Strict):
    """A change that applies only from turn `turn` on (a dialogue's counterfactual,
    ``biaslab replay --mode counterfactual --from-turn K``): the spec's ``nodes``,
    ``conditions`` and ``prompt_overrides`` hold for the calls of turns `turn`, `turn` + 1, ...;
    the calls of earlier turns are made with the settings below (for a counterfactual: its
    source run's, so those turns are answered from the source's trace). Calls are placed in a
    turn by their ``turn-<n>`` item label; a call outside every turn (a rater of the whole
    dialogue) is made with the spec's own settings. Only protocols with a turn loop accept it."""

    turn: int = Field(ge=2, le=1000)
    """The first turn made with the spec's own settings."""
    nodes_before: dict[str, NodeSettings] | None = None
    """Node bindings of the earlier turns; None: the spec's ``nodes``."""
    conditions_before: ConditionSettings | None = None
    """Exposure grid of the earlier turns: each arm's earlier turns get the exposures of the
    arm with the same id in this grid, and no exposure where this grid has no such arm; None:
    no exposure before `turn`."""
    prompt_overrides_before: list[str] | None = None
    """Prompt directories of the earlier turns; None: the spec's ``prompt_overrides``."""


class SwapGroups(_Strict):
    """The judge-bias probe's one change (``biaslab replay --mode counterfactual --node judge
    --swap-groups``): the listed nodes see every slot value, and the texts they judge, with
    the lexicon's group terms swapped; every other node asks what it asked in the source run.
    The pairs are recorded here, so a resume or a report does not depend on the lexicon file."""

    nodes: list[str] = Field(min_length=1)
    """The LLM nodes whose inputs are swapped (the judges)."""
    lexicon: str = "group_terms"
    """Where the pairs came from: the lexicon's name, or the file it was read from."""
    pairs: list[list[str]] = Field(min_length=1)
    """The term pairs, each swapped both ways (`biaslab.prompts.group_swap.Lexicon`)."""


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
    mitigations: dict[str, MitigationSettings] | None = None
    """Mitigation arms by name (``[mitigations.fairness_reminder]``); None or empty: only the
    unmitigated arm, so a spec without the table keeps its cell ids, prompts and cache keys."""
    prompt_overrides: list[str] = []
    """Directories laid out like biaslab/prompts whose templates shadow the packaged ones."""
    from_turn: FromTurn | None = None
    """Apply ``nodes``, ``conditions`` and ``prompt_overrides`` only from a given turn on;
    earlier turns as `FromTurn` says (set by a counterfactual replay with ``--from-turn``)."""
    swap_groups: SwapGroups | None = None
    """Show some nodes their inputs with group terms swapped (set by a counterfactual replay
    with ``--swap-groups``: the judge-bias probe)."""
    plugins: list[str] = []
    """Python files (relative to the spec) or module names that define protocols of your own."""
    options: dict[str, Any] = {}
    """Protocol options, validated by the protocol."""
    scale: dict[str, dict[str, Any]] = {}
    """Named partial overrides, e.g. [scale.smoke]."""
    scale_applied: str = "paper"

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        # The name becomes a directory under runs/: no separators, no '..', no absolute path.
        if not _NAME.fullmatch(value):
            raise ValueError("must be letters, digits, '.', '_' or '-' (it names the run "
                             "directory under runs/), starting with a letter or digit")
        return value

    @field_validator("mitigations")
    @classmethod
    def _mitigation_names(cls, value: dict | None) -> dict | None:
        for name in value or {}:
            if not _NAME.fullmatch(name) or name == "none":
                raise ValueError(f"'{name}' cannot name a mitigation: use letters, digits, "
                                 "'.', '_' or '-' (it names the arm in cell ids), not 'none'")
        return value

    @field_validator("run")
    @classmethod
    def _distinct_seeds(cls, value: RunSettings) -> RunSettings:
        seen = set()
        for seed in value.seeds:
            if seed in seen:
                raise ValueError(f"seed {seed} is listed twice in run.seeds; each replicate "
                                 "needs its own seed")
            seen.add(seed)
        return value


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _first_error(exc: ValidationError, where: str) -> UserError:
    """One line naming the field. The value is shown only where it helps and cannot be a
    pasted credential: never for an unexpected key, and never under a secret-looking name."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    value = err.get("input")
    secret = err["type"] == "extra_forbidden" or any(looks_secret(p) for p in err["loc"])
    shown = f" (got {value!r})" if not secret and not isinstance(value, (dict, list)) else ""
    if err["type"] == "value_error":  # our own validators: the message is the sentence
        return UserError(f"{where}: {loc}: {err['msg'].removeprefix('Value error, ')}")
    hint = " (put keys in the environment and name the variable in a model table's " \
        "api_key_env)" if secret and looks_secret(err["loc"][-1]) else ""
    return UserError(f"{where}: {loc}: {err['msg']}{shown}{hint}")


def _reject_inline_secrets(data: Any, where: str, path: tuple[str, ...] = ()) -> None:
    """A credential pasted anywhere in a spec fails, naming where, never echoing it. Model
    tables are checked by the model parser, which also names the field only."""
    if isinstance(data, dict):
        for key, value in data.items():
            here = (*path, str(key))
            if here[:1] == ("model_aliases",):
                continue
            if isinstance(value, str) and value and looks_secret(key):
                raise UserError(f"{where}: {'.'.join(here)}: looks like a credential; keys are "
                                "never written in a spec: put it in the environment and name "
                                "the variable in a model table's api_key_env")
            _reject_inline_secrets(value, where, here)
    elif isinstance(data, list):
        for value in data:
            _reject_inline_secrets(value, where, path)


def _reject_nul(data: Any, where: str, path: tuple[str, ...] = ()) -> None:
    """A NUL character in any string of a spec fails, naming where: no path, name or URL may
    hold one, and the OS would refuse it only deep inside the run."""
    if isinstance(data, dict):
        for key, value in data.items():
            _reject_nul(key, where, path)
            _reject_nul(value, where, (*path, str(key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _reject_nul(value, where, (*path, str(i)))
    elif isinstance(data, str) and "\x00" in data:
        raise UserError(f"{where}: {'.'.join(path) or 'a key'}: holds a NUL character "
                        "(\\u0000), which no path, name or URL may contain")


def spec_from_dict(data: dict[str, Any], *, scale: str | None = None, where: str = "spec"
                   ) -> ExperimentSpec:
    """Validate a spec dict, applying ``[scale.<scale>]`` when asked."""
    _reject_nul(data, where)
    _reject_inline_secrets(data, where)
    if "app" in data:  # an unmodified LangGraph app to audit (biaslab.graphs.app_audit)
        data = _app_spec(data, where)
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


def _app_spec(data: dict[str, Any], where: str) -> dict[str, Any]:
    """An app spec's ``app``, ``items``, ``[outcome]`` and ``[directions.*]`` as protocol
    ``app-audit``'s options (its own module says how)."""
    from biaslab.graphs.app_audit import app_spec_options

    try:
        return app_spec_options(data)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def read_toml(path: str | Path, what: str = "spec") -> dict[str, Any]:
    """A TOML file as a dict; an unreadable, malformed or absurdly nested file is one line."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a directory, not a TOML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{what} {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"{what} {path} is nested too deeply to be a spec") from None


IMPORTED_PROTOCOL = "imported-traces"
"""The protocol of a run `biaslab import traces` writes (`biaslab.graphs.imported_traces`
registers it under this name; spec loading cannot import the graphs)."""


def refuse_imported_protocol(spec: ExperimentSpec, where: str) -> None:
    """A spec someone wrote (or copied from an imported run) naming ``imported-traces``: one
    line, before any work. That protocol's runs come only from ``biaslab import traces``,
    whose cells are recorded conversations, not runs of a graph."""
    if spec.protocol == IMPORTED_PROTOCOL:
        raise UserError(f"{where}: protocol '{IMPORTED_PROTOCOL}' is not run from a spec: its "
                        "runs are written by biaslab import traces FILE --out RUN (see "
                        "docs/traces.md); to run the app on traced items, write an app audit "
                        "spec whose items name the trace file")


def load_spec(path: str | Path, *, scale: str | None = None) -> ExperimentSpec:
    """Read a TOML spec; every problem is one line naming the file."""
    path = Path(path)
    data = read_toml(path)
    spec = spec_from_dict(data, scale=scale, where=str(path))
    refuse_imported_protocol(spec, str(path))
    # Paths in a spec are relative to the spec file, so a run can be replayed from anywhere.
    base = path.parent

    def resolve(value: str) -> str:
        return value if Path(value).is_absolute() else str((base / value).resolve())

    spec.prompt_overrides[:] = [resolve(d) for d in spec.prompt_overrides]
    spec.plugins[:] = [resolve(p) if p.endswith(".py") or "/" in p else p for p in spec.plugins]
    proto_file, colon, cls = spec.protocol.rpartition(":")
    if colon and proto_file.endswith(".py"):
        spec.protocol = f"{resolve(proto_file)}:{cls}"
    for directory in spec.prompt_overrides:
        if Path(directory).is_file():
            raise UserError(f"{path}: prompt_overrides: {directory} is a file; list directories "
                            "laid out like biaslab/prompts here, and bind a single file with "
                            "[nodes.<node>] prompt = \"file.toml\"")
    for name, node in spec.nodes.items():
        if node.prompt and "@" not in node.prompt and (base / node.prompt).is_dir():
            raise UserError(f"{path}: [nodes.{name}] prompt: {node.prompt} is a directory; "
                            "point it at one .toml template, or list the directory in "
                            "prompt_overrides to shadow the packaged prompts")
        if node.prompt and node.prompt.endswith(".toml"):
            node.prompt = resolve(node.prompt)
    for mitigation in (spec.mitigations or {}).values():
        if mitigation.template and mitigation.template.endswith(".toml"):
            mitigation.template = resolve(mitigation.template)
    if spec.from_turn is not None:
        earlier = spec.from_turn
        if earlier.prompt_overrides_before is not None:
            earlier.prompt_overrides_before[:] = [resolve(d) for d in
                                                  earlier.prompt_overrides_before]
        for node in (earlier.nodes_before or {}).values():
            if node.prompt and node.prompt.endswith(".toml"):
                node.prompt = resolve(node.prompt)
    for key, value in spec.options.items():
        if isinstance(value, str) and key.endswith(PATH_OPTION_SUFFIXES):
            spec.options[key] = resolve(value)
        elif isinstance(value, str) and (re.fullmatch(r".+\.py:\w+", value)
                                         or re.fullmatch(r".+\.json:[\w.-]+", value)):
            # a function of yours, as in `protocol`, or a graph of a langgraph.json
            file, _, name = value.rpartition(":")
            spec.options[key] = f"{resolve(file)}:{name}"
    return spec


PATH_OPTION_SUFFIXES = ("_dir", "_path", "_file", "_labels")
"""Options whose names end so are paths, taken relative to the spec file like its other paths."""


def read_spec_scales(path: str | Path) -> list[str]:
    """The names of a spec file's ``[scale.NAME]`` tables."""
    data = read_toml(path)
    scales = data.get("scale", {})
    return list(scales) if isinstance(scales, dict) else []
