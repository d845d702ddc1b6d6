"""The token budgets per micro-batch (``actor.`` / ``ref.`` / ``critic.max_tokens_per_micro_batch``): each is a number
of tokens (an int >= 0; 0: fixed row counts, or for ref and critic the actor's setting) or ``auto``, which the memory
plan turns into the largest budget that fits the device before any worker starts (``reasonrl.memory.auto``).
Pure: no torch."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

AUTO = "auto"
"""The value that asks the memory plan for the budget."""
BUDGET_KEYS = ("actor.max_tokens_per_micro_batch", "ref.max_tokens_per_micro_batch",
               "critic.max_tokens_per_micro_batch")
"""Every token-budget key, the actor's first."""


def budget_value(cfg: Any, key: str) -> Any:
    """The value of ``key`` (one of ``BUDGET_KEYS``) in ``cfg``: an int or ``auto``."""
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def auto_budget_keys(cfg: Any) -> List[str]:
    """The keys of ``cfg`` set to ``auto`` (still to be resolved), in ``BUDGET_KEYS`` order."""
    return [k for k in BUDGET_KEYS if budget_value(cfg, k) == AUTO]


def validate_token_budgets(cfg: Any, need: Callable[[bool, str, str], None]) -> None:
    """Each budget is an int >= 0 or ``auto``; ``need(ok, key, message)`` raises the ConfigError naming the key."""
    for key in BUDGET_KEYS:
        v = budget_value(cfg, key)
        ok = v == AUTO or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        need(ok, key, f"must be a number of tokens >= 0 or auto, got {v!r}")


def budget_rows(cfg: Any) -> Dict[str, Any]:
    """The budgets that are set (not 0), key -> tokens or ``auto``: what the start-up table shows."""
    return {k: budget_value(cfg, k) for k in BUDGET_KEYS if budget_value(cfg, k) not in (0, None)}
