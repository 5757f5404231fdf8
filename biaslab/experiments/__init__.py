"""biaslab.experiments."""
