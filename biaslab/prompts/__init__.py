"""biaslab.prompts."""
