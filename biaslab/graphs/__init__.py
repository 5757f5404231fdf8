"""Protocol graph builders, the parts to compose new ones, and the protocol registry."""

from biaslab.graphs.compose import add_turn_loop, llm_node, router, sklearn_node, text_answer
from biaslab.graphs.llm_nodes import LLMNode, declare_llm, graph_llm_nodes, llm_agent
from biaslab.graphs.registry import (Protocol, get_protocol, list_protocols, load_plugin,
                                     protocol, protocol_origin)
from biaslab.graphs.units import AnalysisUnit, Measure
from biaslab.graphs import amplification  # noqa: F401  (registers the protocol)
from biaslab.graphs import app_audit  # noqa: F401  (registers app-audit: an unmodified app)
from biaslab.graphs import imported_traces  # noqa: F401  (registers imported-traces: a trace file's cells)
from biaslab.graphs import amplification_synthetic  # noqa: F401  (registers its scripted agent)
from biaslab.graphs import augmentation  # noqa: F401  (registers the protocol)
from biaslab.graphs import augmentation_synthetic  # noqa: F401  (registers its scripted agents)
from biaslab.graphs import multiturn  # noqa: F401  (registers the protocol)
from biaslab.graphs import multiturn_synthetic  # noqa: F401  (registers its scripted agents)
from biaslab.graphs import roleplay, roleplay_generation, roleplay_synthetic  # noqa: F401,E501  (registers the protocols and scripted agents)

__all__ = ["AnalysisUnit", "LLMNode", "Measure", "Protocol", "add_turn_loop", "declare_llm", "get_protocol",
           "graph_llm_nodes", "list_protocols", "llm_agent", "llm_node", "load_plugin",
           "protocol", "protocol_origin", "router", "sklearn_node", "text_answer"]
