"""Batches, prompt datasets, samplers and the curriculum's per-prompt statistics."""
from .batch import Batch
from .curriculum import (SAMPLERS, MixtureSampler, PassRateSampler, curriculum_metrics, largest_remainder,
                         make_sampler, start_curriculum)
from .prompt_stats import PromptStats, group_verdicts, pass_rate_band
from .prompts import EpochSampler, Prompt, PromptDataset, render_prompt

__all__ = ["Batch", "EpochSampler", "MixtureSampler", "PassRateSampler", "Prompt", "PromptDataset", "PromptStats",
           "SAMPLERS", "curriculum_metrics", "group_verdicts", "largest_remainder", "make_sampler",
           "pass_rate_band", "render_prompt", "start_curriculum"]
