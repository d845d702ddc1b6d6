"""Batches, prompt datasets and samplers."""
from .batch import Batch
from .prompts import EpochSampler, Prompt, PromptDataset, render_prompt

__all__ = ["Batch", "EpochSampler", "Prompt", "PromptDataset", "render_prompt"]
