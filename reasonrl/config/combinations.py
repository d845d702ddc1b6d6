"""The rules between features: which combinations a run supports, checked from the config alone.

Each rule names both keys and the reason. ``RunPlan.build`` runs them before Ray or a model starts, and
``load_config`` runs them as it validates, so a user hears of an unsupported combination at once. The combination
matrix (``tests/unit/config/test_combinations.py``) enumerates mode x tools x tensor-parallel x packing x critic x dynamic sampling
x streaming against these rules.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from .async_schema import MPS_MODES, MPS_PRIORITIES, AsyncRolloutConfig
from .rollout_schema import PARTIAL_MODES

Problem = Tuple[str, str]
"""(the key to change, why)."""


def engine_for(engine: str, vllm_installed: Optional[bool]) -> str:
    """``rollout.engine`` resolved: ``auto`` is vllm when it is installed, else hf (still ``auto`` while that is not
    known: ``load_config`` does not look); any other name as set."""
    if engine != "auto" or vllm_installed is None:
        return engine
    return "vllm" if vllm_installed else "hf"


def combination_problems(cfg, vllm_installed: Optional[bool] = None) -> List[Problem]:
    """Every unsupported combination in ``cfg`` as (key, message); empty when the run is supported.
    ``vllm_installed``: whether this machine has vLLM (the plan knows; None: ``auto`` is not judged)."""
    out: List[Problem] = []
    r, alg = cfg.rollout, cfg.algorithm
    engine = engine_for(r.engine, vllm_installed)
    if r.tensor_parallel_size > 1 and engine not in ("vllm", "auto"):
        out.append(("rollout.tensor_parallel_size",
                    f"{r.tensor_parallel_size} needs rollout.engine=vllm (the {engine} engine is not sharded)"))
    if alg.overlong_buffer > r.max_new_tokens:
        out.append(("algorithm.overlong_buffer", f"{alg.overlong_buffer} must not exceed rollout.max_new_tokens "
                                                 f"({r.max_new_tokens}): the buffer is the last tokens before the cap"))
    if cfg.actor.lora.rank > 0 and cfg.actor.compile:
        out.append(("actor.compile", "is not supported with actor.lora.rank > 0 yet (peft's LoRA layers are not "
                                     "compiled regionally)"))
    if cfg.actor.lora.rank > 0 and r.tensor_parallel_size > 1 and not cfg.actor.lora.merge_for_rollout:
        out.append(("actor.lora.merge_for_rollout", "must be true with rollout.tensor_parallel_size > 1 (adapter-only "
                                                    "sync into a sharded engine is not wired)"))
    if r.sleep_level == 2 and cfg.actor.lora.rank > 0 and not cfg.actor.lora.merge_for_rollout:
        out.append(("rollout.sleep_level", "2 discards the engine's weights while it sleeps, and an adapter-only LoRA "
                                           "sync never sends the base weights back: use 1 (or 0, auto), or "
                                           "actor.lora.merge_for_rollout=true"))
    e = cfg.env
    if e.placement == "ray" and not cfg.tool.enabled:
        out.append(("env.placement", "ray needs tool.enabled=true: without the multi-turn loop no environment runs"))
    if e.placement != "ray" and e.resources:
        out.append(("env.resources", f"{dict(e.resources)} needs env.placement=ray (local environments run in the "
                                     f"rollout worker's own process, where Ray resources do not apply)"))
    if cfg.fleet.enabled and cfg.trainer.mode != "async":
        out.append(("fleet.enabled", f"needs trainer.mode=async (not {cfg.trainer.mode}): the fleet's replicas are the "
                                     "async rollout workers; the colocated engines are not a fleet yet"))
    if cfg.fleet.continuous and not cfg.fleet.enabled:
        out.append(("fleet.continuous", "needs fleet.enabled=true: continuous generation runs on the fleet's replicas"))
    if r.partial and not cfg.fleet.continuous:
        out.append(("rollout.partial", "needs fleet.continuous=true: weights reach a response in flight only while "
                                       "the fleet generates continuously"))
    if r.partial_mode not in PARTIAL_MODES:
        out.append(("rollout.partial_mode", f"unknown {r.partial_mode!r}; choose one of {', '.join(PARTIAL_MODES)}"))
    if r.partial and r.partial_mode == "in_engine" and engine not in ("vllm", "auto"):
        out.append(("rollout.partial_mode", f"in_engine needs rollout.engine=vllm (the {engine} engine is not stepped "
                                            "request by request): use segments"))
    if (r.partial and r.partial_mode == "in_engine" and cfg.actor.lora.rank > 0
            and not cfg.actor.lora.merge_for_rollout):
        out.append(("rollout.partial_mode", "in_engine is not supported with an adapter-only LoRA sync "
                                            "(actor.lora.merge_for_rollout=false): a request in flight keeps the "
                                            "adapter it started with; use segments"))
    if r.partial and cfg.tool.enabled:
        out.append(("rollout.partial", "is not supported with tool.enabled yet (a multi-turn trajectory's turns are "
                                       "not segmented): a trajectory runs under the weights its call started with"))
    if cfg.async_rollout.share_devices and cfg.trainer.mode != "async":
        out.append(("async_rollout.share_devices", f"needs trainer.mode=async (not {cfg.trainer.mode}): the colocated "
                                                   "engine already lives on the actor's GPU (and sleeps while it trains)"))
    out += mps_problems(cfg.async_rollout)
    if cfg.trainer.mode != "async":
        return out
    a = cfg.async_rollout
    out += shared_device_problems(cfg)
    if cfg.fleet.enabled:
        placement = cfg.placement or {}
        pool = (placement.get("roles") or {}).get("async_rollout", "rollout")
        held = int(((placement.get("pools") or {}).get(pool) or {}).get("workers", 0))
        if held and a.num_rollout_workers > held:
            out.append(("async_rollout.num_rollout_workers",
                        f"{a.num_rollout_workers} fleet replicas are more than placement.pools.{pool}.workers={held} "
                        "holds (one replica per worker of the rollout pool)"))
    if cfg.data.train_batch_size % a.num_rollout_workers:
        out.append(("async_rollout.num_rollout_workers",
                    f"must divide data.train_batch_size ({cfg.data.train_batch_size})"))
    if r.check_weight_sync and not cfg.fleet.enabled:
        out.append(("rollout.check_weight_sync",
                    "needs fleet.enabled with trainer.mode=async (each replica is checked); the plain async mode's "
                    "rollout/logprob_diff_* metrics (TIS) and tests/e2e/test_async.py check the transferred weights"))
    if r.check_weight_sync and cfg.fleet.enabled and cfg.fleet.continuous and r.partial:
        out.append(("rollout.check_weight_sync",
                    "is not supported with fleet.continuous and rollout.partial: a replica takes the published weights "
                    "at its generation's next segment, so right after a publish it may still hold the older ones"))
    if alg.adv_estimator == "gae":
        out.append(("trainer.mode", "async is not supported with the PPO critic (algorithm.adv_estimator=gae) yet"))
    if alg.dynamic_sampling:
        out.append(("trainer.mode", "async is not supported with DAPO dynamic sampling (algorithm.dynamic_sampling) "
                                    "yet"))
    if r.tensor_parallel_size != 1:
        out.append(("rollout.tensor_parallel_size",
                    "must be 1 with trainer.mode=async: each rollout worker runs one engine of its own, and "
                    "tensor-parallel rollout workers (a process group per engine, weights received by every rank) are "
                    "not wired yet"))
    if alg.adv_estimator == "remax":
        out.append(("trainer.mode", "async is not supported with ReMax (algorithm.adv_estimator=remax: its greedy "
                                    "baseline runs on the engines that are generating the next round) yet"))
    return out


SM_LIMIT_REFUSED = ("is refused for now; leave it at 100: a limit of 60 made the actor's update alone non-finite on "
                    "an H100 (torch 2.11, CUDA 13.0: NaN gradient norm and loss, finite with no limit), so a run "
                    "halts after its first updates (docs/async.md, \"The thirty-third session's lease\")")
"""Why a trainer's SM limit below 100 is refused until the operation that breaks under it is found."""


def mps_problems(a) -> List[Problem]:
    """``async_rollout.mps``: one of its three values; ``required`` only where a GPU is shared. The trainer's MPS
    client limits (``actor_sm_percent``, ``actor_mps_priority``): a known priority, and set only where MPS may run;
    an SM limit below 100 is refused where it would act (``SM_LIMIT_REFUSED``)."""
    if a.mps not in MPS_MODES:
        return [("async_rollout.mps", f"unknown {a.mps!r}; choose one of {', '.join(MPS_MODES)}")]
    if a.mps == "required" and not a.share_devices:
        return [("async_rollout.mps", "required is only read with async_rollout.share_devices=true (a GPU the actor "
                                      "shares with its replica)")]
    if a.actor_mps_priority not in MPS_PRIORITIES:
        return [("async_rollout.actor_mps_priority", f"unknown {a.actor_mps_priority!r}; choose one of "
                                                     f"{', '.join(MPS_PRIORITIES)}")]
    defaults = AsyncRolloutConfig()  # the range of actor_sm_percent: reasonrl/config/ranges.py
    limits = [key for key in ("actor_sm_percent", "actor_mps_priority") if getattr(a, key) != getattr(defaults, key)]
    if not limits:
        return []
    if not a.share_devices:
        why = "only read with async_rollout.share_devices=true (MPS clients on a GPU the actor shares with replicas)"
    elif a.mps == "disabled":
        why = "has no effect with async_rollout.mps=disabled (it limits MPS clients)"
    elif "actor_sm_percent" in limits:
        return [("async_rollout.actor_sm_percent", f"{a.actor_sm_percent} {SM_LIMIT_REFUSED}")]
    else:
        return []
    return [(f"async_rollout.{key}", why) for key in limits]


def shared_device_problems(cfg) -> List[Problem]:
    """``async_rollout.share_devices`` (replica r on actor rank r's device, both awake): it needs the fleet (its
    weights go through Ray's object store; the plain async mode's NCCL group cannot hold two ranks on one GPU), the
    same number of replicas on each actor rank, and the replicas on the actor's pool. The actor ranks' count on a GPU
    machine (all its GPUs) is checked by ``RunPlan.build``."""
    a, out = cfg.async_rollout, []
    if not a.share_devices:
        return out
    if not cfg.fleet.enabled:
        out.append(("async_rollout.share_devices", "needs fleet.enabled=true: a replica on the actor's GPU takes the "
                                                   "weights through Ray's object store (the plain async mode's NCCL "
                                                   "broadcast group refuses two ranks on one GPU)"))
    workers = cfg.trainer.num_workers
    if workers and (a.num_rollout_workers < workers or a.num_rollout_workers % workers):
        out.append(("async_rollout.num_rollout_workers",
                    f"{a.num_rollout_workers} must be a multiple of trainer.num_workers ({workers}) with "
                    "async_rollout.share_devices=true: the same number of replicas on each actor rank's device"))
    roles = (cfg.placement or {}).get("roles") or {}
    if "async_rollout" in roles:
        out.append(("placement.roles.async_rollout", f"{roles['async_rollout']!r} conflicts with "
                                                     "async_rollout.share_devices=true, which puts the replicas on "
                                                     "the actor's pool"))
    return out
