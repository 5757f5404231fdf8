"""biaslab: a simulator for LLM fairness protocols built on LangGraph."""
__version__ = "0.1.0"
