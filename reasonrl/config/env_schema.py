"""The ``env`` config section: environments in multi-turn rollouts (docs/environments.md), and its checks.

Its numeric fields' intervals are added to ``ranges.FIELD_RANGES`` here (the rest of the config's are there), and
``check_env_config`` is called from ``load.validate``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from .ranges import FIELD_RANGES

ENV_FIELD_RANGES = {
    "env.step_timeout_s": "(0, inf)", "env.max_calls_per_turn": "[1, inf)", "env.max_call_chars": "[1, inf)",
    "env.max_observation_chars": "[1, inf)", "env.num_actors": "[1, inf)", "env.num_cpus_per_actor": "[0, inf)",
}
FIELD_RANGES.update(ENV_FIELD_RANGES)
NO_ENVIRONMENT = "none"
PLACEMENTS = ("local", "ray")


@dataclass
class EnvConfig:
    """Environments (``reasonrl.envs``): with ``tool.enabled`` each row's ``environment`` column picks the
    environment its trajectories run in; tool calls, limits and the drift check."""

    default: Optional[str] = None
    """Environment of the rows that name none (no ``environment`` column, or an empty one). None: ``tool.name``,
    so every such row runs the tool (``task=math_tool``); ``none``: such rows are plain prompts (one model turn)."""
    step_timeout_s: float = 60.0
    """Wall-clock limit of one environment step; a step past it ends its trajectory as a failure
    (``env_failed``), not the run."""
    max_calls_per_turn: int = 8
    """Calls run per model turn; more in one turn are answered with one error observation (counted malformed)."""
    max_call_chars: int = 8192
    """A tool call longer than this many characters is refused unread (an error observation, counted malformed)."""
    max_observation_chars: int = 2048
    """An observation longer than this is cut to its head and tail before it is tokenised."""
    drift_check: bool = True
    """Compare each trajectory's trained tokens with the chat template's rendering of its conversation and count
    the differences: at a turn boundary, in a tool turn or in text (``env/drift_rate``), and those that are only
    the model's own non-canonical token split (``env/noncanonical_rate``, harmless: the tokens are kept)."""
    drift_fatal: bool = False
    """With ``drift_check``: a trajectory whose tokens differ from the rendering at a turn boundary, in a tool turn
    or in text stops the rollout with an error naming the first differing position (a non-canonical split of the
    model's own text does not)."""
    placement: str = "local"
    """Where environment steps run: ``local`` (threads of the generating worker's process) or ``ray`` (a pool of
    ``num_actors`` Ray actors per generating worker, on the nodes that have ``num_cpus_per_actor`` CPUs and
    ``resources`` free; a dead actor fails only the trajectories it held, ``reasonrl/envs/remote.py``)."""
    num_actors: int = 2
    """With ``placement=ray``: environment actors per generating worker; each runs up to ``tool.concurrency``
    steps at once, and a trajectory stays on the actor it started on."""
    num_cpus_per_actor: float = 1.0
    """With ``placement=ray``: CPUs each environment actor reserves from Ray (0: none)."""
    resources: Dict[str, float] = field(default_factory=dict)
    """With ``placement=ray``: Ray custom resources each environment actor asks for, to pin the actors to the nodes
    started with them (``ray start --resources='{"env_node": 8}'`` and ``env.resources={env_node: 1}``)."""


def check_env_config(cfg: Any, need: Callable[[bool, str, str], None]) -> None:
    """Cross-field rules of the ``env`` section (``need(ok, key, message)`` raises the ConfigError)."""
    e = cfg.env
    need(not e.drift_fatal or e.drift_check, "env.drift_fatal", "needs env.drift_check=true")
    need(e.placement in PLACEMENTS, "env.placement", f"must be one of {', '.join(PLACEMENTS)}, got {e.placement!r}")
    bad = {k: v for k, v in (e.resources or {}).items()
           if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0}
    need(not bad, "env.resources", f"must map resource names to amounts >= 0, got {bad}")
    if e.default not in (None, NO_ENVIRONMENT, ""):
        from reasonrl.envs import available_environments

        known = available_environments()
        need(e.default in known, "env.default", f"unknown environment {e.default!r}; known: {', '.join(known)}, "
             f"{NO_ENVIRONMENT}")
