"""Per-step metrics from a rollout batch, and a phase timer."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Optional

import torch

from reasonrl.algorithms import kl_penalty, logprob_mismatch_stats, masked_mean, off_policy_metrics, off_policy_sums
from reasonrl.config.algorithm_schema import reported_version_lags
from reasonrl.data.batch import Batch
from reasonrl.data.sample import EnvOutcome, Round, ToolOutcome


class PhaseTimer:
    """``with timer("rollout"): ...`` adds the seconds to ``timing_s/rollout``. ``on_phase(phase, None)`` is called as
    a phase starts and ``on_phase(phase, seconds)`` as it ends (the console's progress, ``progress.StepProgress``)."""

    def __init__(self, on_phase: Optional[Callable[[str, Optional[float]], None]] = None) -> None:
        self.seconds: Dict[str, float] = {}
        self.on_phase = on_phase

    @contextmanager
    def __call__(self, phase: str):
        if self.on_phase is not None:
            self.on_phase(phase, None)
        start = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.seconds[phase] = self.seconds.get(phase, 0.0) + took
            if self.on_phase is not None:
                self.on_phase(phase, took)

    def metrics(self) -> Dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}


def startup_metrics(startup_seconds: Dict[str, float], first_step: Dict[str, Any]) -> Dict[str, float]:
    """``startup_s/<phase>`` (model_resolution, data, ray_start, workers_up, engine_start, first_rollout,
    first_step) and ``startup_s/launch_to_first_step`` (from the process start), printed once."""
    out = {f"startup_s/{k}": v for k, v in startup_seconds.items()}
    out["startup_s/first_rollout"] = float(first_step.get("timing_s/rollout", 0.0))
    out["startup_s/first_step"] = float(first_step.get("timing_s/step", 0.0))
    try:
        import psutil

        out["startup_s/launch_to_first_step"] = time.time() - psutil.Process().create_time()
    except ImportError:
        pass
    print("start-up: " + ", ".join(f"{k.split('/', 1)[1]} {v:.1f}s" for k, v in out.items()), flush=True)
    return out


def rollout_metrics(scores: torch.Tensor, correct: List[bool], response_mask: torch.Tensor,
                    finish_reasons: List[str], verdicts: Optional[torch.Tensor] = None) -> Dict[str, float]:
    """Reward and accuracy over the responses with a verdict (``verdicts`` [B] bool; None: all), lengths over all.
    With no verdict at all the reward keys are left out rather than reported as 0."""
    lengths = response_mask.sum(-1)
    out = {
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/clip_ratio": sum(r == "length" for r in finish_reasons) / max(1, len(finish_reasons)),
    }
    keep = [i for i in range(len(scores)) if verdicts is None or bool(verdicts[i])]
    if keep:
        judged = scores[keep]
        out["reward/mean"] = float(judged.mean())
        out["reward/std"] = float(judged.std()) if len(judged) > 1 else 0.0
        out["reward/accuracy"] = sum(bool(correct[i]) for i in keep) / len(keep)
    return out


def round_metrics(samples: List[Any], scores: torch.Tensor, response_mask: torch.Tensor,
                  verdicts: torch.Tensor) -> Dict[str, float]:
    """A round's reward, accuracy (over the verdicts) and lengths, per-verifier metrics over the verdicts, the tool
    loop's metrics when it ran (the Samples carry a ``tool_mask``), and partial rollouts' when the Samples carry
    per-token versions (``partial_rollout_metrics``)."""
    results = [s.result for s in samples]
    out = rollout_metrics(scores, [r.correct for r in results], response_mask, [s.finish_reason for s in samples],
                          verdicts)
    judged = verdicts.nonzero().squeeze(-1).tolist()
    out.update(per_verifier_metrics([samples[i].verifier for i in judged], [results[i].score for i in judged],
                                    [results[i].correct for i in judged]))
    if samples and samples[0].tool_mask is not None:  # multi-turn tool rollout (tool.enabled)
        from reasonrl.envs.metrics import env_metrics

        columns = outcome_columns(samples)
        out.update(tool_metrics(columns))
        out.update(env_metrics(columns, results))
    out.update(partial_rollout_metrics(samples))
    return out


def validation_env_metrics(samples: List[Any]) -> Dict[str, float]:
    """A validation pass's ``val/env/*`` metrics (``reasonrl.envs.metrics.val_env_metrics``) from its samples;
    none unless they came from a multi-turn tool rollout."""
    if not samples or samples[0].tool_mask is None:
        return {}
    from reasonrl.envs.metrics import val_env_metrics

    return val_env_metrics(outcome_columns(samples))


def outcome_columns(samples: List[Any]) -> Dict[str, List[Any]]:
    """The per-response columns of a tool rollout's outcomes (``Sample.tools``, ``Sample.env``), under the names
    ``tool_metrics`` and ``env_metrics`` read (``reasonrl.rollout.multiturn.TOOL_META_KEYS``)."""
    tools = [s.tools or ToolOutcome() for s in samples]
    envs = [s.env or EnvOutcome() for s in samples]
    return {"tool_mask": [s.tool_mask for s in samples], "turns": [t.turns for t in tools],
            "tool_calls": [t.tool_calls for t in tools], "tool_errors": [t.tool_errors for t in tools],
            "tool_timeouts": [t.tool_timeouts for t in tools], "tool_seconds": [t.tool_seconds for t in tools],
            "malformed_calls": [t.malformed_calls for t in tools], "calls_per_tool": [t.calls_per_tool for t in tools],
            "env": [e.name for e in envs], "env_failed": [e.failed for e in envs], "env_reward": [e.reward for e in envs],
            "step_rewards": [e.step_rewards for e in envs], "env_drift": [e.drift for e in envs],
            "env_noncanonical": [e.noncanonical for e in envs]}


def per_verifier_metrics(verifiers: List[str], scores: List[float], correct: List[bool]) -> Dict[str, float]:
    """For data that mixes tasks: ``reward/<verifier>/{count,mean,accuracy}`` over the responses each verifier
    scored (one entry per verifier that scored any)."""
    out: Dict[str, float] = {}
    for name in sorted(set(verifiers)):
        picked = [i for i, v in enumerate(verifiers) if v == name]
        out[f"reward/{name}/count"] = float(len(picked))
        out[f"reward/{name}/mean"] = sum(scores[i] for i in picked) / len(picked)
        out[f"reward/{name}/accuracy"] = sum(bool(correct[i]) for i in picked) / len(picked)
    return out


def policy_metrics(old_log_probs: torch.Tensor, ref_log_probs, entropy, mask: torch.Tensor) -> Dict[str, float]:
    out = {}
    if entropy is not None:
        out["actor/entropy"] = float(masked_mean(entropy, mask))
    if ref_log_probs is not None:
        out["actor/kl"] = float(masked_mean(kl_penalty(old_log_probs, ref_log_probs, "k3"), mask))
    return out


def behaviour_gap_metrics(cfg, batch: Batch, mask: torch.Tensor) -> Dict[str, float]:
    """The engine's log-probs (``rollout_log_probs``, the behaviour policy) against the pass's (``old_log_probs``, the
    proximal policy): ``rollout/logprob_diff_*`` and the ``offpolicy/*`` metrics of ``algorithm.off_policy`` (by
    version lag when the batch carries ``version_lag``; ``algorithms/off_policy_metrics.py``)."""
    prox, behav = batch["old_log_probs"], batch["rollout_log_probs"]
    sums = off_policy_sums(prox, behav, mask, **asdict(cfg.algorithm.off_policy), lags=reported_version_lags(cfg),
                           lag=batch["version_lag"] if "version_lag" in batch else None)
    return {**logprob_mismatch_stats(prox, behav, mask), **off_policy_metrics(sums)}


def with_version_lag(batch: Batch, samples: List[Any], step: int) -> Batch:
    """``batch`` with ``version_lag`` (``step`` minus the weight version that generated each sample) when the
    samples carry their version (``trainer.mode=async``): [B], or [B, T] per response token when partial rollouts
    recorded each token's version (padding gets the sample's oldest); as it is otherwise."""
    if not samples or samples[0].weights_version is None:
        return batch
    if any(s.token_versions for s in samples):
        width = batch["response_mask"].shape[1]
        lag = torch.tensor([[step - s.weights_version] * width for s in samples])
        for i, s in enumerate(samples):
            if s.token_versions:
                lag[i, :len(s.token_versions)] = torch.tensor([step - v for v in s.token_versions])
        batch["version_lag"] = lag
    else:
        batch["version_lag"] = torch.tensor([step - s.weights_version for s in samples])
    return batch


def partial_rollout_metrics(samples: List[Any]) -> Dict[str, float]:
    """How much of a batch partial rollouts carried across a weight load (``rollout.partial``): the share of samples
    whose response tokens came from more than one weight version (``rollout/partial_spanning_frac``), the share of
    response tokens made by a newer version than their sample's first token (``rollout/partial_newer_token_frac``)
    and the share of samples whose replica call joined another's running engine steps (``rollout/partial_joined_frac``;
    in-engine mode, else 0). Empty when no sample records per-token versions."""
    recorded = [s.token_versions for s in samples if s.token_versions]
    if not recorded:
        return {}
    newer = sum(sum(1 for v in versions if v != versions[0]) for versions in recorded)
    return {"rollout/partial_spanning_frac": sum(len(set(v)) > 1 for v in recorded) / len(samples),
            "rollout/partial_newer_token_frac": newer / max(1, sum(len(v) for v in recorded)),
            "rollout/partial_joined_frac": sum(s.joined_running for s in samples) / len(samples)}


def tool_metrics(gen) -> Dict[str, float]:
    """Multi-turn tool rollouts (meta of the workers' ``generate``): turns per trajectory, tool calls, errors,
    timeouts and seconds, and the share of response tokens that tool turns wrote."""
    rows = max(1, len(gen["turns"]))
    calls = sum(gen["tool_calls"])
    tool_tokens = sum(sum(m) for m in gen["tool_mask"])
    all_tokens = sum(len(m) for m in gen["tool_mask"])
    return {
        "tool/turns_mean": sum(gen["turns"]) / rows,
        "tool/turns_max": float(max(gen["turns"], default=0)),
        "tool/calls_per_trajectory": calls / rows,
        "tool/calls": float(calls),
        "tool/errors": float(sum(gen["tool_errors"])),
        "tool/timeouts": float(sum(gen["tool_timeouts"])),
        "tool/error_rate": sum(gen["tool_errors"]) / max(1, calls),
        "tool/seconds": float(sum(gen["tool_seconds"])),
        "tool/output_token_fraction": tool_tokens / max(1, all_tokens),
    }


def level_of(row: Dict[str, Any]) -> str:
    """A row's level for the mix metrics: ``extra_info.level`` when the task has levels, else its ``data_source``."""
    return str((row.get("extra_info") or {}).get("level") or row.get("data_source"))


def data_levels(rows: List[Dict[str, Any]]) -> List[str]:
    """The levels of a dataset's rows, sorted; per-level metrics are logged only when there are two or more."""
    levels = sorted({level_of(r) for r in rows})
    return levels if len(levels) > 1 else []


def round_level_metrics(rnd: Round, levels: List[str]) -> Dict[str, float]:
    """A round's mix: ``levels/responses`` (rollouts), ``levels/informative_groups`` (share of the round's groups
    whose verdicts differ: the ones a group-relative advantage learns from, as DAPO's filter counts them), and per
    level of ``levels`` its share of the groups (0 when the round drew none) and its training accuracy over verdicts.
    Groups are the round's (``Round.groups``: one per prompt, by the Samples' group ids)."""
    from .dynamic_sampling import informative_group_ids

    if not rnd.prompts:
        raise ValueError(f"a round of {len(rnd.samples)} samples and no prompts")
    groups = rnd.groups()
    out = {"levels/responses": float(len(rnd.samples)),
           "levels/informative_groups": len(informative_group_ids(rnd)) / len(groups)}
    for level in levels:
        picked = [g for g, p in enumerate(rnd.prompts) if level_of(p.row) == level]
        judged = [s.result for g in picked for s in groups[g] if not s.result.failed]
        out[f"levels/share/{level}"] = len(picked) / len(groups)
        if judged:
            out[f"levels/train_accuracy/{level}"] = sum(bool(r.correct) for r in judged) / len(judged)
    return out


def val_level_metrics(rows: List[Dict[str, Any]], results: List[Any]) -> Dict[str, float]:
    """``val/<level>/accuracy`` over the responses with a verdict (one per held-out row), when the held-out rows have
    two or more levels."""
    out: Dict[str, float] = {}
    for level in data_levels(rows):
        judged = [res for r, res in zip(rows, results) if level_of(r) == level and not res.failed]
        if judged:
            out[f"val/{level}/accuracy"] = sum(bool(r.correct) for r in judged) / len(judged)
    return out


def slowest_rank(per_rank: List[Dict[str, float]]) -> Dict[str, float]:
    """The largest value of each key over the ranks (a phase lasts as long as its slowest rank)."""
    out: Dict[str, float] = {}
    for metrics in per_rank:
        for k, v in metrics.items():
            out[k] = max(out.get(k, v), v)
    return out
