"""biaslab.evaluators."""
