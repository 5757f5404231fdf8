"""Protocol graph builders, the parts to compose new ones, and the protocol registry."""

from biaslab.graphs.compose import add_turn_loop, llm_node, router, sklearn_node, text_answer
from biaslab.graphs.registry import LLMNode, Protocol, get_protocol, list_protocols, protocol
from biaslab.graphs import amplification  # noqa: F401  (registers the protocol)
from biaslab.graphs import amplification_synthetic  # noqa: F401  (registers its scripted agent)

__all__ = ["LLMNode", "Protocol", "add_turn_loop", "get_protocol", "list_protocols", "llm_node",
           "protocol", "router", "sklearn_node", "text_answer"]
