"""What a run derives from its config before anything loads, resolved once: the ``RunPlan``. Pure: no torch.

``RunPlan.build(cfg, hardware)`` (called by ``reasonrl.train`` before Ray starts; ``hardware`` is the machine's facts,
``reasonrl.hardware.local_hardware``, or a named one in tests and the doctor) decides the device, the data-parallel
world size, the engine, the batch plan (``batch_plan.py``), which passes run (``passes.py``), the sampling of
training and validation rollouts, the generator (plain or the tool loop), the mode, the per-device settings
(``device_defaults.py``), the weight sync (its bucket bytes, the LoRA sync kind) and the placement numbers, and runs
every rule between features (``combinations.py``): an unsupported combination fails there, naming the keys.

``plan.with_model(facts, token_budgets)`` is the second step, once the model's ``config.json`` is read
(``model_facts.ModelFacts``): it checks the context against ``max_model_len``'s rows and fixes the token budgets
that were ``auto`` (resolved from this plan by the memory plan, ``reasonrl.memory.resolve_run_budgets``). The config is never written:
``plan.run_config(cfg)`` is a copy with the plan's resolved values, the one the workers and the memory plan read.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Mapping, Optional, Tuple

from .batch_plan import BatchPlan
from .combinations import combination_problems, engine_for
from .device_defaults import RESOLVED_KEYS, DeviceSetting, Hardware, device_settings
from .load import ConfigError
from .model_facts import ModelFacts
from .passes import Passes, passes_needed
from .token_budget import AUTO
from .worker_plan import WorkerPlan

CPU = Hardware()
"""A machine with no GPU (whether it has vLLM is not asked): what tests plan for."""


@dataclass(frozen=True)
class RunPlan:
    """The facts of one run derived from its config (see the module docstring)."""

    device: str
    """``cpu`` or ``cuda`` (``trainer.device``, ``auto`` resolved by ``Hardware``)."""
    mode: str
    """``colocated`` (the engines live in the actor workers) or ``async`` (rollout workers of their own)."""
    world_size: int
    """Actor (data-parallel) ranks."""
    engine: str
    """The rollout engine (``rollout.engine``; ``auto`` resolved when the hardware says whether vLLM is installed)."""
    engine_ranks: int
    """Ranks that share one rollout engine (``rollout.tensor_parallel_size``)."""
    rollout_workers: int
    """Rollout workers of ``async`` mode (0 when colocated)."""
    steps_ahead: int
    """Rounds generated ahead of training (``async_rollout.max_staleness``; 0 when colocated)."""
    batch: BatchPlan
    """Every batch size (checked); its token budgets are numbers once ``with_model`` resolved ``auto``."""
    passes: Passes
    """The teacher-forced passes a step runs (old log-probs, reference, values)."""
    generator: str
    """``plain`` (the engine) or ``tools`` (the multi-turn tool loop around it, ``tool.enabled``)."""
    offload: bool
    """Any of actor/ref/critic offload is on."""
    rollout_logprobs: bool
    """Training rollouts carry the engine's log-probs (``rollout.logprobs``; auto: an off-policy correction or the
    weight-sync check)."""
    stream_chunk_prompts: int
    """Prompts per streamed sub-batch (rewards while generating; 0: one generate call)."""
    training_sampling: Dict[str, Any]
    """``SamplingParams`` fields of training rollouts (``rollout.n`` samples at ``rollout.temperature``)."""
    validation_sampling: Dict[str, Any]
    """``SamplingParams`` fields of validation (one sample at ``rollout.val_temperature``, no log-probs)."""
    ray_cpus: int
    """CPUs Ray is started with (the machine's, twice when two groups time-share them)."""
    cpu_groups: int
    """Worker groups that time-share the cores on CPU (actor, critic, rollout): each worker gets the cluster's CPUs
    divided by world size x groups (``controller.cpus_per_worker``, once Ray is up)."""
    gpu_share: float
    """GPU fraction of each actor rank (0.5 when the critic shares it; with ``share_devices``, 1 / (1 + the replicas
    on it); each replica takes the same fraction)."""
    engine_sleep_level: int
    """vLLM's sleep level on GPU (``rollout.sleep_level`` resolved, ``engine_sleep_level``)."""
    lora_sync: str
    """What a weight sync sends: ``off`` (no LoRA: the full weights), ``adapter`` (the LoRA adapter alone) or
    ``merged`` (the base with the adapter merged in, ``actor.lora.merge_for_rollout``)."""
    bucket_bytes: int
    """Bytes per weight-sync bucket (``rollout.weight_sync_bucket_mb`` MiB)."""
    device_settings: Tuple[DeviceSetting, ...]
    """The per-device settings as used, with why (``device_defaults.device_settings``)."""
    max_model_len: int
    """The engine's context: ``data.max_prompt_length`` + the longer of ``rollout.max_new_tokens`` and
    ``eval.max_new_tokens`` (validation generates with the same engine)."""
    model: Optional[ModelFacts] = None
    """The model's facts, once ``with_model`` read them."""
    replica_calls: int = 1
    """Generate calls a fleet replica takes at once: 2 with ``rollout.partial_mode=in_engine`` (a second call joins
    the engine's running step loop, ``rollout/step_loop.py``), else 1."""
    share_devices: bool = False
    """``async_rollout.share_devices`` in async mode: rollout replica r on actor rank r mod ``world_size``'s device
    (one bundle, each ``gpu_share`` of its GPU), its engine awake while the actor trains; the actor has every GPU."""
    replicas_per_device: int = 0
    """With ``share_devices``: the replicas on each actor rank's device (``num_rollout_workers`` / actor ranks), so
    ``gpu_share`` is 1 / (1 + this); 0 otherwise."""

    @property
    def use_critic(self) -> bool:
        return self.passes.values

    @property
    def is_async(self) -> bool:
        return self.mode == "async"

    def for_workers(self) -> WorkerPlan:
        """What the training workers read from this plan (handed to each with ``run_config``)."""
        return WorkerPlan(batch=self.batch, device=self.device, engine=self.engine,
                          hosts_engine=not self.is_async, tools=self.generator == "tools",
                          engine_sleep_level=self.engine_sleep_level, lora_sync=self.lora_sync,
                          bucket_bytes=self.bucket_bytes, max_model_len=self.max_model_len)

    @classmethod
    def build(cls, cfg: Any, hardware: Hardware = CPU) -> "RunPlan":
        """The plan of ``cfg`` on ``hardware``; ConfigError naming the keys when a combination is unsupported or the
        batch sizes do not divide (nothing has started yet)."""
        problems = combination_problems(cfg, hardware.vllm_installed)
        if problems:
            raise ConfigError("; ".join(f"config key '{k}': {m}" for k, m in problems))
        device = hardware.device
        world = world_size_for(cfg, device, hardware.gpu_count)
        batch = BatchPlan.from_config(cfg, world)
        try:
            batch.check()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        r, is_async = cfg.rollout, cfg.trainer.mode == "async"
        rollout_workers = cfg.async_rollout.num_rollout_workers if is_async else 0
        share = is_async and cfg.async_rollout.share_devices
        if share and (rollout_workers < world or rollout_workers % world):
            raise ConfigError(f"config key 'async_rollout.num_rollout_workers': {rollout_workers} must be a multiple "
                              f"of the {world} actor workers with async_rollout.share_devices=true (the same number "
                              f"of replicas on each actor rank's device"
                              f"{'; the actor gets every GPU' if device == 'cuda' else ''})")
        replicas_per_device = rollout_workers // world if share else 0
        if is_async and rollout_workers > 1 and world % rollout_workers and not cfg.fleet.enabled:
            raise ConfigError(f"config key 'async_rollout.num_rollout_workers': {rollout_workers} must divide the "
                              f"{world} actor workers (validation pads batches to the actor count)")
        if world % r.tensor_parallel_size:
            raise ConfigError(f"config key 'rollout.tensor_parallel_size': {r.tensor_parallel_size} must divide the "
                              f"{world} actor workers (each engine spans that many ranks)")
        passes = passes_needed(cfg, batch)
        cores = hardware.cpu_count
        logprobs = rollout_logprobs_wanted(cfg)
        sampled = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k}
        return cls(
            device=device, mode=cfg.trainer.mode, world_size=world,
            engine=engine_for(r.engine, hardware.vllm_installed),
            engine_ranks=r.tensor_parallel_size, rollout_workers=rollout_workers,
            steps_ahead=cfg.async_rollout.max_staleness if is_async else 0,
            batch=batch, passes=passes, generator="tools" if cfg.tool.enabled else "plain",
            offload=offload_enabled(cfg), rollout_logprobs=logprobs, stream_chunk_prompts=r.stream_chunk_prompts,
            engine_sleep_level=engine_sleep_level(cfg), lora_sync=lora_sync_kind(cfg),
            bucket_bytes=int(r.weight_sync_bucket_mb * 2 ** 20),
            training_sampling={"n": batch.samples_per_prompt, **sampled, "max_new_tokens": r.max_new_tokens,
                               "logprobs": logprobs},
            validation_sampling={"n": 1, "temperature": r.val_temperature, "top_p": 1.0, "top_k": -1,
                                 "max_new_tokens": r.max_new_tokens, "logprobs": False},
            ray_cpus=cores * max(2 if (passes.values or is_async) else 1, 1 + replicas_per_device),
            cpu_groups=1 + int(passes.values) + max(int(is_async), replicas_per_device),  # sharing the cores on CPU
            gpu_share=1.0 / (1 + replicas_per_device) if share else 0.5 if passes.values else 1.0,
            share_devices=share, replicas_per_device=replicas_per_device,
            replica_calls=2 if r.partial and r.partial_mode == "in_engine" else 1,
            device_settings=tuple(device_settings(cfg, device, hardware.varlen_attention)),
            max_model_len=cfg.data.max_prompt_length + max(r.max_new_tokens, cfg.eval.max_new_tokens))

    def with_model(self, facts: ModelFacts, token_budgets: Optional[Mapping[str, int]] = None) -> "RunPlan":
        """The final plan once the model's ``config.json`` is read: ConfigError naming the keys when a prompt and its
        response cannot fit the model's context; ``token_budgets`` (key -> tokens) replace the ``auto`` ones."""
        need = self.batch.longest_row
        if facts.max_positions is not None and need > facts.max_positions:
            raise ConfigError(f"config key 'rollout.max_new_tokens': data.max_prompt_length "
                              f"({need - self.training_sampling['max_new_tokens']}) + rollout.max_new_tokens "
                              f"({self.training_sampling['max_new_tokens']}) = {need} exceeds the model's context of "
                              f"{facts.max_positions} tokens ({facts.name})")
        chosen = dict(token_budgets or {})
        budgets = tuple((k, chosen.get(k, v) if v == AUTO else v) for k, v in self.batch.token_budgets)
        return replace(self, model=facts, batch=replace(self.batch, token_budgets=budgets))

    def run_config(self, cfg: Any) -> Any:
        """A copy of ``cfg`` with what this plan resolved filled in (the per-device settings, the token budgets
        ``with_model`` chose): the config the workers, the start-up table and the memory plan read. ``cfg`` itself
        is not written."""
        values = {s.key: s.value for s in self.device_settings if s.key in RESOLVED_KEYS}
        values.update((k, v) for k, v in self.batch.token_budgets if v != AUTO)
        sections: Dict[str, Dict[str, Any]] = {}
        for key, value in values.items():
            section, name = key.split(".")
            sections.setdefault(section, {})[name] = value
        return replace(cfg, **{s: replace(getattr(cfg, s), **changes) for s, changes in sections.items()})


def world_size_for(cfg: Any, device: str, gpu_count: int) -> int:
    """Actor workers (data-parallel ranks); with trainer.mode=async the rollout workers' GPUs are not counted (unless
    ``async_rollout.share_devices``: the actor gets every GPU and the replicas share them)."""
    if cfg.trainer.num_workers:
        return cfg.trainer.num_workers
    separate = cfg.trainer.mode == "async" and not cfg.async_rollout.share_devices
    rollout_gpus = cfg.async_rollout.num_rollout_workers if separate else 0
    return max(1, gpu_count - rollout_gpus) if device == "cuda" else 1


def rollout_logprobs_wanted(cfg: Any) -> bool:
    """Whether training rollouts ask the engine for log-probs (``rollout.logprobs``; None: only when an off-policy
    correction or the weight-sync check uses them)."""
    if cfg.rollout.logprobs is not None:
        return bool(cfg.rollout.logprobs)
    return cfg.algorithm.off_policy.correction != "none" or cfg.rollout.check_weight_sync


def offload_enabled(cfg: Any) -> bool:
    return any((cfg.actor.offload_params, cfg.actor.offload_optimizer, cfg.ref.offload_params,
                cfg.critic.offload_params, cfg.critic.offload_optimizer))


def lora_sync_kind(cfg: Any) -> str:
    """``off`` without LoRA, ``adapter`` when a sync sends the adapter alone, ``merged`` with
    ``actor.lora.merge_for_rollout``."""
    if cfg.actor.lora.rank <= 0:
        return "off"
    return "merged" if cfg.actor.lora.merge_for_rollout else "adapter"


def engine_sleep_level(cfg: Any) -> int:
    """``rollout.sleep_level`` resolved: 1 (a host copy of the weights) when a sync sends only the LoRA adapter, else
    2 (the weights are discarded: every sync refills all of them, so a host copy would only cost host memory and
    two copies per step); an explicit 1 or 2 as set (``combinations`` refuses 2 with an adapter-only sync)."""
    if cfg.rollout.sleep_level:
        return cfg.rollout.sleep_level
    return 1 if lora_sync_kind(cfg) == "adapter" else 2
