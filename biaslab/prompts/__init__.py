"""Prompt templates (data files with declared slots), their registry, and bias exposures."""

from biaslab.prompts.exposure import (CLEAN, Condition, Exposure, apply_exposures,
                                      exposure_conditions)
from biaslab.prompts.registry import PromptRegistry, PromptTemplate

__all__ = ["CLEAN", "Condition", "Exposure", "PromptRegistry", "PromptTemplate",
           "apply_exposures", "exposure_conditions"]
