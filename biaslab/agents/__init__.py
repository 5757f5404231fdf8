"""Node kinds and model providers: everything that talks to a model goes through `ask`."""

from biaslab.agents.ask import Answer, ask, call_seed
from biaslab.agents.context import Bindings, CellContext
from biaslab.agents.gateway import Gateway, RetryPolicy, RunCounters
from biaslab.agents.parsers import (OutputConstraint, ParseError, json_object, label_with_reason,
                                    probability_list, probability_list_grammar)
from biaslab.agents.providers import ModelSpec, build_chat_model, parse_model

__all__ = ["Answer", "Bindings", "CellContext", "Gateway", "ModelSpec", "OutputConstraint",
           "ParseError", "RetryPolicy", "RunCounters", "ask", "build_chat_model", "json_object",
           "label_with_reason", "parse_model", "probability_list", "probability_list_grammar",
           "call_seed"]
