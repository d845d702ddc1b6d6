"""KL coefficient controllers (``algorithm.kl_ctrl``): fixed, or adaptive towards a target KL (Ziegler et al.,
2019, "Fine-Tuning Language Models from Human Preferences").

Adaptive rule, once per training step::

    error   = clip(current_kl / kl_target - 1, -0.2, 0.2)
    kl_coef = kl_coef * (1 + error * n_steps / kl_horizon)

``n_steps`` is what the step consumed, in the unit ``kl_horizon`` counts (Ziegler et al. count samples: pass
the step's number of responses). ``current_kl`` is the step's measured KL in the unit of ``kl_target``.
"""

from __future__ import annotations

import math
from typing import Dict

from reasonrl.registry import Registry

ADAPTIVE_ERROR_CLIP = 0.2
"""|current_kl / target - 1| is clipped to this, so one step moves the coefficient by at most 20% * n/horizon."""


def _finite(value: float, what: str, positive: bool) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{what} must be a finite number {'> 0' if positive else '>= 0'}, got {value}")
    return value


class FixedKLController:
    """``kl_coef`` never changes; ``update`` returns it."""

    def __init__(self, kl_coef: float):
        """``kl_coef``: the weight of the KL term."""
        self.kl_coef = _finite(kl_coef, "kl_coef", positive=False)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Returns the (unchanged) coefficient."""
        return self.kl_coef

    def state_dict(self) -> Dict[str, float]:
        """The coefficient, for checkpoints."""
        return {"kl_coef": self.kl_coef}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        """Restore what ``state_dict`` returned."""
        if "kl_coef" not in state:
            raise ValueError(f"a KL controller state needs 'kl_coef', got keys {sorted(state)}")
        self.kl_coef = _finite(state["kl_coef"], "kl_coef", positive=False)


class AdaptiveKLController(FixedKLController):
    """Moves ``kl_coef`` up when the measured KL is above ``target`` and down when below (rule in the module
    docstring); ``horizon`` sets how fast."""

    def __init__(self, kl_coef: float, target: float, horizon: float):
        """``kl_coef``: initial coefficient; ``target``: the KL to hold (> 0); ``horizon``: steps (samples) over
        which a persistent error of 20% changes the coefficient by about a factor e^0.2 (> 0)."""
        super().__init__(kl_coef)
        self.target = _finite(target, "kl_target", positive=True)
        self.horizon = _finite(horizon, "kl_horizon", positive=True)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Apply one step of the rule; returns the new coefficient."""
        current_kl = _finite(current_kl, "current_kl", positive=False)
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps}")
        error = min(max(current_kl / self.target - 1.0, -ADAPTIVE_ERROR_CLIP), ADAPTIVE_ERROR_CLIP)
        self.kl_coef = self.kl_coef * (1.0 + error * n_steps / self.horizon)
        return self.kl_coef


KL_CONTROLLERS = Registry("KL controller", config_key="algorithm.kl_ctrl")
"""``algorithm.kl_ctrl`` names: factories ``(kl_coef, target, horizon) -> controller``."""
KL_CONTROLLERS.register("fixed", lambda kl_coef, target, horizon: FixedKLController(kl_coef))
KL_CONTROLLERS.register("adaptive", AdaptiveKLController)


def make_kl_controller(kind: str, kl_coef: float, target: float, horizon: float) -> FixedKLController:
    """The controller ``algorithm.kl_ctrl`` names (``target``/``horizon`` are used by ``adaptive`` only)."""
    return KL_CONTROLLERS.build(kind, kl_coef, target, horizon)
