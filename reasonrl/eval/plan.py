"""What an evaluation derives from its config before anything loads, resolved once: the ``EvalPlan``.

The evaluation's counterpart of the trainer's ``RunPlan`` (``reasonrl/config/plan.py``): the device, the
engine, the generator (the engine, or the multi-turn tool loop around it), the sampling of every problem and the
engine's context; a sampling setting that cannot give a meaningful pass@k fails here, naming the key, before the
tokenizer or the engine loads. The runner reads these facts from the plan, not from the raw config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from reasonrl.hardware import resolve_device
from reasonrl.config.schema import Config


class EvalError(RuntimeError):
    """An evaluation that cannot run as configured (bad model path, missing verifier, greedy with n > 1...)."""


@dataclass(frozen=True)
class EvalPlan:
    """The facts of one evaluation derived from its config (see the module docstring)."""

    device: str
    """``cpu`` or ``cuda`` (``trainer.device``, ``auto`` resolved as in training)."""
    engine: str
    """The rollout engine (``rollout.engine``, ``auto`` resolved: vllm when installed, else hf)."""
    generator: str
    """``plain`` (the engine) or ``tools`` (the multi-turn tool loop around it, ``tool.enabled``)."""
    sampling: Dict[str, Any]
    """``SamplingParams`` fields of every problem's ``eval.n`` samples (the seed is set per batch)."""
    max_model_len: int
    """The engine's context: the longest prompt plus ``eval.max_new_tokens``."""
    split: str
    """``val`` or ``train`` (``eval.split``)."""

    @classmethod
    def build(cls, cfg: Config) -> "EvalPlan":
        """The plan of ``cfg``; EvalError naming the key for settings that cannot give a meaningful pass@k."""
        from reasonrl.rollout import resolve_engine_name

        check_sampling(cfg)
        e = cfg.eval
        if e.split not in ("val", "train"):
            raise EvalError(f"eval.split must be val or train, got {e.split!r}")
        return cls(device=resolve_device(cfg.trainer.device), engine=resolve_engine_name(cfg.rollout.engine),
                   generator="tools" if cfg.tool.enabled else "plain",
                   sampling={"n": e.n, "temperature": e.temperature, "top_p": e.top_p,
                             "max_new_tokens": e.max_new_tokens, "logprobs": False},
                   max_model_len=cfg.data.max_prompt_length + e.max_new_tokens, split=e.split)


def check_sampling(cfg: Config) -> None:
    """Reject sampling settings that cannot give meaningful pass@k (the single fields' intervals are
    ``config/ranges.py``'s, checked by ``load_config``; these rules relate two fields)."""
    e = cfg.eval
    if e.temperature <= 0 and e.n > 1:
        raise EvalError(f"eval.temperature={e.temperature} (greedy) with eval.n={e.n} would repeat one answer "
                        f"{e.n} times; use eval.n=1 for greedy, or eval.temperature>0 for sampling")
    bad_k = [k for k in e.k if not 1 <= k <= e.n]
    if not e.k or bad_k:
        raise EvalError(f"eval.k needs values between 1 and eval.n ({e.n}); got {list(e.k)}")
