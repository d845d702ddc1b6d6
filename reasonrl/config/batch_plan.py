"""The batch plan: every batch size of a run, derived once from the config at start-up.

Sizes are stated once, in prompts (``data.train_batch_size``, ``actor.ppo_mini_batch_size``), plus samples per prompt
(``rollout.n``) and rows per micro-batch (``actor.micro_batch_size_per_worker``). The trainer builds one frozen
``BatchPlan`` (it prints ``table()`` and calls ``check()``) and hands it to every worker; workers read their mini- and
micro-batch sizes from it and nothing else. Pure arithmetic: config is read by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Tuple

from .token_budget import AUTO, budget_rows


@dataclass(frozen=True)
class BatchPlan:
    """The sizes of one run (see the module docstring)."""

    prompts_per_step: int
    """Prompts sampled per training step (``data.train_batch_size``)."""
    samples_per_prompt: int
    """Responses sampled per prompt (``rollout.n``)."""
    world_size: int
    """Data-parallel worker ranks."""
    mini_batch_prompts: int
    """Prompts per optimizer step (``actor.ppo_mini_batch_size``, or the whole step's prompts when 0/None)."""
    ppo_epochs: int
    """Passes over the step's mini-batches (``actor.ppo_epochs``)."""
    micro_batch_rows: int
    """Rows per forward/backward on one worker (``actor.micro_batch_size_per_worker``)."""
    token_budgets: Tuple[Tuple[str, Any], ...] = ()
    """The token budgets that are set, (key, tokens or ``auto``): ``*.max_tokens_per_micro_batch`` not 0
    (``token_budget.budget_rows``); ``auto`` until the memory plan resolves it at start-up."""
    longest_row: int = 0
    """Tokens of the longest row (``data.max_prompt_length`` + ``rollout.max_new_tokens``): bounds the micro-batches
    a token budget makes."""

    @classmethod
    def from_config(cls, cfg: Any, world_size: int) -> "BatchPlan":
        """The plan of ``cfg`` (a ``Config``) over ``world_size`` ranks; not yet checked (see ``check``)."""
        return cls(prompts_per_step=cfg.data.train_batch_size, samples_per_prompt=cfg.rollout.n,
                   world_size=world_size,
                   mini_batch_prompts=mini_batch_prompts(cfg),
                   ppo_epochs=cfg.actor.ppo_epochs, micro_batch_rows=cfg.actor.micro_batch_size_per_worker,
                   token_budgets=tuple(budget_rows(cfg).items()),
                   longest_row=cfg.data.max_prompt_length + cfg.rollout.max_new_tokens)

    # ------------------------------------------------------------------ derived sizes
    @property
    def auto_budget_keys(self) -> List[str]:
        """The token budgets still ``auto`` (``RunPlan.with_model`` fixes them)."""
        return [k for k, v in self.token_budgets if v == AUTO]

    @property
    def rows_per_worker(self) -> int:
        """Responses of one step on one rank (at least 1)."""
        return max(1, self.responses_per_step // self.world_size)

    @property
    def responses_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def responses_per_mini_batch(self) -> int:
        return self.mini_batch_prompts * self.samples_per_prompt

    @property
    def responses_per_mini_batch_per_worker(self) -> int:
        return self.responses_per_mini_batch // self.world_size

    @property
    def mini_batches_per_step(self) -> int:
        """Optimizer steps per training step, per pass."""
        return self.prompts_per_step // self.mini_batch_prompts

    def mini_batches_for(self, rows_per_worker: int) -> int:
        """How many mini-batches a worker splits its ``rows_per_worker`` rows into (at least 1). Fewer rows than
        planned (dynamic sampling keeps only informative groups) give proportionally fewer mini-batches."""
        return max(1, rows_per_worker * self.world_size // self.responses_per_mini_batch)

    # ------------------------------------------------------------------ start-up
    def check(self) -> None:
        """Every rank gets the same work: raises ValueError naming the keys otherwise."""
        if self.prompts_per_step % self.world_size:
            raise ValueError(f"data.train_batch_size={self.prompts_per_step} must be divisible by the "
                             f"{self.world_size} workers")
        if self.responses_per_mini_batch % self.world_size:
            raise ValueError(f"actor.ppo_mini_batch_size x rollout.n = {self.responses_per_mini_batch} responses must "
                             f"be divisible by the {self.world_size} workers")

    def table(self) -> List[Tuple[str, Any]]:
        """The derived sizes printed at start-up (an uneven split shows as ``B/W!``; ``check`` then refuses it)."""
        B, W = self.prompts_per_step, self.world_size
        per_worker_mini = self.responses_per_mini_batch_per_worker
        budgets = dict(self.token_budgets)
        micro: Any = -(-per_worker_mini // self.micro_batch_rows)
        actor_budget = budgets.get("actor.max_tokens_per_micro_batch")
        if actor_budget == AUTO:
            micro = "by token budget (auto)"
        elif actor_budget:  # every group holds at least budget // longest row rows (first-fit decreasing)
            micro = f"at most {-(-per_worker_mini // max(1, actor_budget // max(1, self.longest_row)))} (token budget)"
        rows = [
            ("prompts per step (data.train_batch_size)", B),
            ("samples per prompt (rollout.n)", self.samples_per_prompt),
            ("responses per step", self.responses_per_step),
            ("workers (data-parallel ranks)", W),
            ("prompts per worker per step", B // W if B % W == 0 else f"{B}/{W}!"),
            ("mini-batches per step (optimizer steps x ppo_epochs)", self.mini_batches_per_step * self.ppo_epochs),
            ("responses per mini-batch", self.responses_per_mini_batch),
            ("responses per mini-batch per worker", per_worker_mini),
            ("micro-batches per mini-batch per worker", micro),
        ]
        for key, tokens in self.token_budgets:
            rows.append((f"tokens per micro-batch ({key})",
                         "auto (the memory plan picks it at start-up)" if tokens == AUTO else tokens))
        return rows


def mini_batch_prompts(cfg: Any) -> int:
    """Prompts per optimizer step: ``actor.ppo_mini_batch_size``, or the whole step's prompts when 0/None (the one
    statement of that rule: the batch plan, the passes, validation and the memory plan ask here)."""
    return cfg.actor.ppo_mini_batch_size or cfg.data.train_batch_size
