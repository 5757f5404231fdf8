"""biaslab: a simulator for LLM fairness protocols built on LangGraph."""
__version__ = "0.1.0"

__all__ = ["Run", "open_run", "run"]


def __getattr__(name: str):
    """``biaslab.open_run``, ``biaslab.run`` and ``biaslab.Run`` (see `biaslab.api`), imported
    on first use so that ``import biaslab`` (every CLI start) loads no pandas or LangGraph."""
    if name in __all__:
        import biaslab.api

        return getattr(biaslab.api, name)
    raise AttributeError(f"module 'biaslab' has no attribute {name!r}")
