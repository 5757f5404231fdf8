"""biaslab.agents."""
