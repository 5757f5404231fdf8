"""Prompt templates (data files with declared slots), their registry, bias exposures, and
group-term swaps (the judge-bias probe)."""

from biaslab.prompts.exposure import (CLEAN, Condition, Exposure, apply_exposures,
                                      exposure_conditions)
from biaslab.prompts.group_swap import GroupSwap, Lexicon, load_lexicon
from biaslab.prompts.registry import PromptRegistry, PromptTemplate

__all__ = ["CLEAN", "Condition", "Exposure", "GroupSwap", "Lexicon", "PromptRegistry",
           "PromptTemplate", "apply_exposures", "exposure_conditions", "load_lexicon"]
