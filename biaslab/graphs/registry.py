"""Protocols by name. A protocol is a graph family plus how to grid, seed and report it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

from langgraph.graph import StateGraph
from pydantic import BaseModel

from biaslab.errors import UserError

__all__ = ["Protocol", "LLMNode", "protocol", "get_protocol", "list_protocols"]


@dataclass(frozen=True)
class LLMNode:
    """An LLM node as the grid sees it: its name, default prompt and the slots it offers."""

    name: str
    prompt: str
    slots: tuple[str, ...]


class Protocol:
    """Base class for a registered protocol.

    Subclasses set `name`, `Options` (a pydantic model of the spec's ``[options]`` table) and
    `directions` (exposure direction → template slot values), and implement the methods below.
    """

    name: ClassVar[str]
    Options: ClassVar[type[BaseModel]]
    directions: ClassVar[Mapping[str, Mapping[str, str]]] = {}

    def variants(self, options: BaseModel) -> list[str]:
        """Graph variants in the grid (e.g. pipelines)."""
        raise NotImplementedError

    def llm_nodes(self, variant: str) -> list[LLMNode]:
        """The variant's LLM nodes in graph order; exposure arms are generated from these."""
        raise NotImplementedError

    def build(self, variant: str) -> StateGraph:
        """The uncompiled graph for a variant."""
        raise NotImplementedError

    def items(self, options: BaseModel) -> list[str]:
        """The grid's item axis (datasets, scenarios...)."""
        raise NotImplementedError

    def initial_state(self, variant: str, item: str, seed: int, options: BaseModel) -> dict:
        raise NotImplementedError

    def estimate(self, variant: str, item: str, options: BaseModel) -> dict[str, float]:
        """Upper-bound ``calls`` and ``tokens`` of one cell, before anything runs."""
        raise NotImplementedError

    def report(self, store: Any, run_dir: Path, options: BaseModel) -> list[Path]:
        """Tables and figures from the store alone (no model calls)."""
        raise NotImplementedError

    def all_nodes(self) -> set[str]:
        return {n.name for v in self.variants(self.Options()) for n in self.llm_nodes(v)}

    def parse_options(self, raw: Mapping[str, Any]) -> BaseModel:
        try:
            return self.Options(**raw)
        except Exception as exc:
            first = str(exc).splitlines()
            detail = " ".join(first[1:3]).strip() if len(first) > 1 else first[0]
            raise UserError(f"bad [options] for protocol '{self.name}': {detail}") from None


_PROTOCOLS: dict[str, type[Protocol]] = {}


def protocol(cls: type[Protocol]) -> type[Protocol]:
    """Class decorator: make a protocol available by its `name`."""
    _PROTOCOLS[cls.name] = cls
    return cls


def get_protocol(name: str) -> Protocol:
    import biaslab.graphs  # noqa: F401  (registers the built-in protocols)

    if name not in _PROTOCOLS:
        raise UserError(f"unknown protocol '{name}' (known: {', '.join(sorted(_PROTOCOLS))})")
    return _PROTOCOLS[name]()


def list_protocols() -> Iterable[str]:
    import biaslab.graphs  # noqa: F401

    return sorted(_PROTOCOLS)
