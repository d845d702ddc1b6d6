"""Build a Config from ``key=value`` arguments through OmegaConf's structured configs.

An unknown key, a value of the wrong type or a number outside its range (``ranges.FIELD_RANGES``) raises ConfigError
naming the key, before anything loads. A key given twice takes the last value, ``task=`` and ``algorithm=`` too.
"""
from __future__ import annotations

import copy
import functools
import difflib
import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .batch_plan import mini_batch_prompts
from .placement_schema import validate_placement
from .presets import ALGORITHM_PRESETS, CPU_PROFILE, LAPTOP_PROFILE, MODE_PRESETS, PROFILE_LENGTH_CEILINGS, TASK_PRESETS
from .env_schema import check_env_config
from .lora_schema import validate_lora
from .ranges import FIELD_RANGES
from .schema import Config
from .token_budget import validate_token_budgets
from .worker_plan import ADAMW_IMPLS


class ConfigError(ValueError):
    """A bad command-line key or value."""


def _split_args(args: Iterable[str]) -> List[Tuple[str, str]]:
    pairs = []
    for arg in args:
        if "=" not in arg or arg.startswith("="):
            raise ConfigError(f"expected key=value, got {arg!r} (e.g. trainer.total_steps=10)")
        key, value = arg.split("=", 1)
        pairs.append((key.strip().lstrip("+"), value))
    return pairs


def _profile_applies(profile: str, device: str, cuda_available: Optional[bool]) -> bool:
    if profile == "cpu":
        return True
    if profile != "auto":
        return False
    if device == "cpu":
        return True
    if device == "cuda":
        return False
    if cuda_available is None:  # the machine's answer (reasonrl.hardware asks torch; the config does not import it)
        from reasonrl.hardware import cuda_available as machine_has_cuda

        cuda_available = machine_has_cuda()
    return not cuda_available


@functools.lru_cache(maxsize=1)
def _schema():
    """``Config``'s structured OmegaConf node, built once per process (about a third of a ``load_config`` call);
    never changed: every merge returns a new node and leaves its inputs as they were."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(Config)


def _merge(base, layers: List[Tuple[str, Any]]):
    """``base`` with each ``(what, layer)`` merged over it in turn (a dict or an OmegaConf node), in one
    ``OmegaConf.merge`` (each merge copies the whole tree once); a failure is merged again layer by layer to name the
    one that failed: ``what: config key ...``."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    nodes = [layer if OmegaConf.is_config(layer) else OmegaConf.create(layer) for _, layer in layers]
    try:
        return OmegaConf.merge(base, *nodes)
    except OmegaConfBaseException:
        pass
    for (what, _), node in zip(layers, nodes):
        try:
            base = OmegaConf.merge(base, node)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{what}: {_describe(exc)}" if what else _describe(exc)) from None
    raise AssertionError("a merge failed at once but not layer by layer")  # OmegaConf merges in order either way


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'gsm8k'?)`` for the known name closest to a misspelled ``name``; empty when none is close
    (the same suggestion OmegaConf makes for a misspelled key)."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _describe(exc: Exception) -> str:
    """An OmegaConf error as one line, naming the key."""
    key = getattr(exc, "full_key", None)
    msg = str(exc).splitlines()[0]
    if key:
        return f"config key '{key}': {msg}"
    return msg


def load_config(args: Iterable[str] = (), cuda_available: Optional[bool] = None) -> Tuple[Config, Dict[str, Any]]:
    """Returns (config, notes). ``notes`` says which presets and profile were applied."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    pairs = _split_args(args)
    task = ([v for k, v in pairs if k == "task"] or ["gsm8k"])[-1]  # the last one given wins, as for dotted keys
    algorithm = ([v for k, v in pairs if k == "algorithm"] or [None])[-1]
    if task not in TASK_PRESETS:
        raise ConfigError(f"config key 'task': unknown task {task!r}{did_you_mean(task, TASK_PRESETS)}; "
                          f"known: {', '.join(sorted(TASK_PRESETS))}")
    if algorithm is not None and algorithm not in ALGORITHM_PRESETS:
        raise ConfigError(f"config key 'algorithm': unknown algorithm {algorithm!r}"
                          f"{did_you_mean(algorithm, ALGORITHM_PRESETS)}; "
                          f"known: {', '.join(sorted(ALGORITHM_PRESETS))} (or set algorithm.<field>=...)")
    user = legacy_off_policy_keys([(k, v) for k, v in pairs if k not in ("task", "algorithm")])
    if any(k == "algorithm.kl_estimator" for k, _ in user):
        raise ConfigError("config key 'algorithm.kl_estimator' was split in two: set algorithm.kl_loss_estimator "
                          "(the KL in the loss, default k3) and/or algorithm.kl_reward_estimator (the KL in the "
                          "reward, default k1)")

    presets = [("task", {"task": task}), (f"task preset {task}", copy.deepcopy(TASK_PRESETS[task]))]
    if algorithm is not None:
        presets.append((f"algorithm {algorithm}", {"algorithm": {"name": algorithm, **ALGORITHM_PRESETS[algorithm]}}))
    cfg = _merge(_schema(), presets)

    try:
        user_cfg = OmegaConf.from_dotlist([f"{k}={v}" for k, v in user])
    except OmegaConfBaseException as exc:
        raise ConfigError(_describe(exc)) from None
    # Profile is decided from the user's trainer.* choices, then layered beneath the user's values.
    try:
        probe = OmegaConf.merge(cfg, user_cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(_describe(exc)) from None
    notes: Dict[str, Any] = {"task": task, "algorithm": algorithm or probe.algorithm.name, "profile": None}
    beneath_user: List[Tuple[str, Any]] = []
    if probe.trainer.profile == "laptop":
        beneath_user.append(("laptop profile", copy.deepcopy(LAPTOP_PROFILE)))
        notes["profile"] = "laptop"
    elif _profile_applies(probe.trainer.profile, probe.trainer.device, cuda_available):
        beneath_user.append(("cpu profile", _cpu_profile_under(cfg, TASK_PRESETS[task])))
        notes["profile"] = "cpu"
    if probe.trainer.mode in MODE_PRESETS:
        beneath_user.append((f"trainer.mode={probe.trainer.mode}", copy.deepcopy(MODE_PRESETS[probe.trainer.mode])))
    cfg = _merge(cfg, [*beneath_user, ("", user_cfg)]) if beneath_user else probe
    obj: Config = OmegaConf.to_object(cfg)
    if obj.algorithm.off_policy.correction == "False":  # YAML reads a bare `off` as false: off means none
        obj.algorithm.off_policy.correction = "none"
    validate(obj)
    return obj, notes


def _cpu_profile_under(cfg, task_preset: Dict[str, Any]) -> Dict[str, Any]:
    """The CPU profile for ``cfg`` (the task and algorithm presets merged): its lengths are ceilings, so a task whose
    own length is shorter keeps it (arith generates 64 tokens on a CPU too, not the profile's 160), except a prompt
    length the task preset sets: its prompts need it (``Task.prompt_tokens``), and a shorter one would drop them all."""
    profile = copy.deepcopy(CPU_PROFILE)
    if "max_prompt_length" in task_preset.get("data", {}):
        del profile["data"]["max_prompt_length"]  # the task's prompts need their length
    for section, key in PROFILE_LENGTH_CEILINGS:
        if key in profile.get(section, {}):
            profile[section][key] = min(profile[section][key], cfg[section][key])
    return profile


def validate(cfg: Config) -> None:
    """Cross-field checks that types alone cannot express."""
    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            raise ConfigError(f"config key '{key}': {msg}")

    check_ranges(cfg)
    validate_token_budgets(cfg, need)
    need(cfg.rollout.engine in ("auto", "vllm", "hf"), "rollout.engine", "must be auto, vllm or hf")
    mb = mini_batch_prompts(cfg)
    need(cfg.data.train_batch_size % mb == 0, "actor.ppo_mini_batch_size",
         f"must divide data.train_batch_size ({cfg.data.train_batch_size})")
    need(cfg.trainer.resume in ("auto", "never") or bool(cfg.trainer.resume), "trainer.resume",
         "auto, never, or a checkpoint directory")
    need(cfg.trainer.device in ("auto", "cpu", "cuda"), "trainer.device", "must be auto, cpu or cuda")
    need(cfg.trainer.profile in ("auto", "cpu", "laptop", "none"), "trainer.profile",
         "must be auto, cpu, laptop or none")
    need(cfg.model.dtype in ("auto", "float32", "bfloat16", "float16"), "model.dtype",
         "must be auto, float32, bfloat16 or float16")
    _validate_algorithm(cfg, need)
    correction = cfg.algorithm.off_policy.correction
    need(not (correction != "none" and cfg.rollout.logprobs is False), "rollout.logprobs",
         f"must not be false with algorithm.off_policy.correction={correction} (its importance weights divide by the "
         f"rollout log-probs)")
    need(cfg.tool.sandbox in ("auto", "bwrap", "docker"), "tool.sandbox",
         "must be auto, bwrap or docker (model code never runs unsandboxed)")
    need(cfg.trainer.mode in ("colocated", "async"), "trainer.mode", "must be colocated or async")
    need(cfg.rollout.sleep_level in (0, 1, 2), "rollout.sleep_level", "must be 0 (auto), 1 or 2")
    need(cfg.ref.param_dtype in ("auto", "float32"), "ref.param_dtype", "must be auto or float32")
    need(cfg.actor.adamw_impl in ADAMW_IMPLS, "actor.adamw_impl", f"must be one of {', '.join(ADAMW_IMPLS)}")
    check_env_config(cfg, need)
    from .combinations import combination_problems  # the rules between features (the RunPlan runs them too)

    for key, message in combination_problems(cfg)[:1]:
        need(False, key, message)
    need(len(cfg.actor.betas) == 2, "actor.betas", f"must be two numbers [beta1, beta2], got {cfg.actor.betas}")
    low_high = cfg.reward.score_range
    need(len(low_high) == 2 and all(math.isfinite(x) for x in low_high) and low_high[0] < low_high[1],
         "reward.score_range", f"must be two finite numbers [low, high] with low < high, got {low_high}")
    _validate_curriculum(cfg, need)
    from reasonrl.rewards.registry import validate_reward_sources  # the registered sources, plugins included

    validate_reward_sources(cfg, need)  # each source's settings, reward.source_options, reward.sources
    validate_placement(cfg, need)  # the placement section's shape (placement_schema.py)
    validate_lora(cfg, need)
    for k in cfg.eval.k:
        need(1 <= k <= cfg.eval.n, "eval.k", f"each k must be between 1 and eval.n ({cfg.eval.n}); got {k}")


def _validate_algorithm(cfg: Config, need) -> None:
    """Names in algorithm.* against the registries of reasonrl.algorithms (so a registered plugin is accepted),
    and the policy loss's options against what that loss declares."""
    from reasonrl import algorithms as algs  # torch: imported only when a config is validated

    alg = cfg.algorithm

    def one_of(value: str, names, key: str) -> None:
        need(value in names, key, f"unknown {value!r}; choose one of {', '.join(sorted(names))}")

    one_of(alg.adv_estimator, algs.ADV_ESTIMATORS, "algorithm.adv_estimator")
    one_of(alg.policy_loss, algs.POLICY_LOSSES, "algorithm.policy_loss")
    one_of(alg.loss_agg_mode, algs.LOSS_AGG_MODES, "algorithm.loss_agg_mode")
    one_of(alg.kl_loss_estimator, algs.KL_ESTIMATORS, "algorithm.kl_loss_estimator")
    one_of(alg.kl_reward_estimator, algs.KL_ESTIMATORS, "algorithm.kl_reward_estimator")
    one_of(alg.kl_ctrl, algs.KL_CONTROLLERS, "algorithm.kl_ctrl")
    if alg.kl_ctrl == "adaptive":  # the rule is multiplicative: a coefficient of 0, or no KL term, never moves
        need(alg.kl_coef > 0 and (alg.use_kl_loss or alg.kl_in_reward), "algorithm.kl_ctrl",
             "adaptive needs algorithm.kl_coef > 0 and a KL term (algorithm.use_kl_loss or algorithm.kl_in_reward)")
    try:
        algs.resolve_policy_loss_options(alg.policy_loss, dict(alg.policy_loss_options))
    except ValueError as exc:
        need(False, "algorithm.policy_loss_options", str(exc))
    _validate_off_policy(alg, need)
    if alg.adv_estimator == "pass_at_k":
        need(alg.pass_k <= cfg.rollout.n, "algorithm.pass_k", f"must not exceed rollout.n ({cfg.rollout.n})")
        need(not alg.kl_in_reward, "algorithm.kl_in_reward",
             "must be false with adv_estimator=pass_at_k (it counts 0/1 scores); use algorithm.use_kl_loss")
        need(alg.overlong_buffer == 0, "algorithm.overlong_buffer",
             "must be 0 with adv_estimator=pass_at_k (the overlong penalty makes scores fractional)")


def _validate_off_policy(alg, need) -> None:
    """algorithm.off_policy: the names, the decoupled objective's pairing with ppo_clip, masked IS's interval."""
    from reasonrl.algorithms import CORRECTIONS, IS_LEVELS

    off = alg.off_policy
    need(off.correction in CORRECTIONS, "algorithm.off_policy.correction",
         f"unknown {off.correction!r}; choose one of {', '.join(CORRECTIONS)}")
    need(off.level in IS_LEVELS, "algorithm.off_policy.level",
         f"unknown {off.level!r}; choose one of {', '.join(IS_LEVELS)}")
    if off.correction == "decoupled":
        need(alg.policy_loss == "ppo_clip", "algorithm.policy_loss",
             f"must be ppo_clip with algorithm.off_policy.correction=decoupled (the decoupled objective is PPO's "
             f"clipped surrogate), got {alg.policy_loss}; use correction=tis or mis to weight another loss")
        need(off.level == "token", "algorithm.off_policy.level",
             "must be token with algorithm.off_policy.correction=decoupled (its behaviour weight is per token)")
    if off.correction == "mis":
        need(off.lower < off.upper, "algorithm.off_policy.lower",
             f"must be below algorithm.off_policy.upper ({off.upper}), got {off.lower}")


def legacy_off_policy_keys(pairs: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """``algorithm.tis_mode=off|token|sequence`` and ``algorithm.tis_cap=c`` as their ``algorithm.off_policy.*``
    spellings (correction none, or tis at that level; cap c), so configs written before the section still run."""
    out: List[Tuple[str, str]] = []
    for key, value in pairs:
        if key == "algorithm.tis_mode":
            mode = value.strip().lower()
            if mode in ("off", "false"):
                out.append(("algorithm.off_policy.correction", "none"))
            elif mode in ("token", "sequence"):
                out += [("algorithm.off_policy.correction", "tis"), ("algorithm.off_policy.level", mode)]
            else:
                raise ConfigError(f"config key 'algorithm.tis_mode': must be off, token or sequence, got {value!r} "
                                  f"(it is algorithm.off_policy.correction=tis with algorithm.off_policy.level now)")
        elif key == "algorithm.tis_cap":
            out.append(("algorithm.off_policy.cap", value))
        else:
            out.append((key, value))
    return out


def _validate_curriculum(cfg: Config, need) -> None:
    """data.sampler and the keys of its curriculum (docs/curriculum.md)."""
    d = cfg.data
    need(d.sampler in ("uniform", "pass_rate", "mixture"), "data.sampler", "must be uniform, pass_rate or mixture")
    need(len(d.pass_rate_prior) == 2, "data.pass_rate_prior",
         f"must be two positive numbers [a, b] (a Beta prior), got {d.pass_rate_prior}")
    need(len(d.pass_rate_band) == 2 and d.pass_rate_band[0] <= d.pass_rate_band[1], "data.pass_rate_band",
         f"must be [lo, hi] with lo <= hi, got {d.pass_rate_band}")
    need(bool(d.pass_rate_file) or list(d.pass_rate_band) == [0.0, 1.0], "data.pass_rate_band",
         "needs data.pass_rate_file (the evaluation whose pass rates it filters by)")
    if d.sampler == "mixture":
        need(bool(d.mixture), "data.mixture", "must give a ratio per data_source with data.sampler=mixture, e.g. "
             "data.mixture={openai/gsm8k: 3, mbpp: 1}")
        need(all(math.isfinite(r) and r >= 0 for r in d.mixture.values()) and sum(d.mixture.values()) > 0,
             "data.mixture", f"ratios must be finite, >= 0 and not all 0, got {dict(d.mixture)}")
    else:
        need(not d.mixture, "data.mixture", f"is only read with data.sampler=mixture (data.sampler={d.sampler})")


def parse_interval(text: str) -> Tuple[float, float, bool, bool]:
    """``"(0, 1]"`` -> (0.0, 1.0, False, True): low, high, low included, high included."""
    lo, hi = (float(x) for x in text[1:-1].split(","))
    return lo, hi, text[0] == "[", text[-1] == "]"


def in_interval(value: float, text: str) -> bool:
    lo, hi, lo_in, hi_in = parse_interval(text)
    if isinstance(value, float) and math.isnan(value):
        return False
    return (lo < value or (lo_in and value == lo)) and (value < hi or (hi_in and value == hi))


def check_ranges(cfg: Config) -> None:
    """Every numeric field (each element of a numeric list) inside its ``FIELD_RANGES`` interval."""
    for key, interval in FIELD_RANGES.items():
        value = cfg
        for name in key.split("."):  # section.field, or section.subsection.field
            value = getattr(value, name)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and not in_interval(v, interval):
                raise ConfigError(f"config key '{key}': {v} is out of range; allowed: {interval}")


def to_yaml(cfg: Config) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Config) -> Dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg))


def from_dict(d: Dict[str, Any]) -> Config:
    """Rebuild a Config from ``to_dict`` output (checkpoints store it)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(d)))
