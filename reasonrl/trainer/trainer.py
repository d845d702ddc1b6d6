"""The RL loop. One step reads like the algorithm:

round (rollout -> verify, from the rollout source) -> old log-probs -> ref log-probs -> advantages -> update ->
publish the weights (through the source),

each phase under a timer (``timing_s/<phase>``), all metrics of a step in one dict. The same loop serves both modes:
the only difference is the source (the plan mode's ``rollout_source.RolloutSource``; the loop calls only its members).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from reasonrl.algorithms import (compute_advantages, kl_penalty, kl_shaped_token_rewards,
                                 make_kl_controller, overlong_penalty)
from reasonrl.config import Config, to_dict, to_yaml
from reasonrl.config.plan import RunPlan
from reasonrl.controller import WorkerGroup
from reasonrl.data import Batch, PromptDataset
from reasonrl.data.collate import loss_mask
from reasonrl.data.curriculum import curriculum_metrics, make_sampler, start_curriculum
from reasonrl.data.prompt_stats import group_verdicts
from reasonrl.data.sample import Round, Sample, collate_samples
from reasonrl.datasets import task_files
from reasonrl.fault_points import fault_point
from reasonrl.interrupt import stop_at_boundary
from reasonrl.logging import library_output
from reasonrl.logging.sample_log import SAMPLE_LOG, VAL_SAMPLE_LOG, sample_log_row
from reasonrl.models import load_tokenizer, resolve_model_path
from reasonrl.rewards import check_verifiers, make_pool

from .checkpoint import drop_rows_after, read_trainer_state, save_checkpoint, usable_checkpoint, verify_checkpoint
from .dynamic_sampling import refill_informative_groups
from .failures import (SkippedStepGuard, advantages_over_verdicts, check_failed_fraction, failure_metrics,
                       verdict_mask, without_failed)
from .metrics import (PhaseTimer, behaviour_gap_metrics, data_levels, level_of, policy_metrics, round_level_metrics,
                      round_metrics, slowest_rank, startup_metrics, val_level_metrics, validation_env_metrics,
                      with_version_lag)
from .model_checks import plan_with_model
from .progress import StepProgress, validation_bar
from .sources import make_source
from .watchdog import PhaseWatchdog

log = logging.getLogger(__name__)


class Trainer:
    """The single controller over a ``RunPlan``. ``backend`` starts the worker groups (``backends.RayBackend``: Ray
    actors; ``backends.InProcessBackend``: the same workers in this process, for benchmarks and fast tests); the
    rollout source follows from the plan's mode (``sources``)."""

    _stop = None  # fit's StopRequest, from its start (``stop_signal``)

    def __init__(self, cfg: Config, plan: RunPlan, backend: Any) -> None:
        self.cfg, self.plan = plan.run_config(cfg), plan  # the per-device settings resolved (a copy: cfg is not written)
        self.startup = PhaseTimer()  # startup_s/<phase>: logged with the first step, printed once
        self.world_size, self.batch_plan = plan.world_size, plan.batch
        if plan.offload and plan.device == "cpu":
            log.warning("offload (actor/ref/critic.offload_*) has no effect on a CPU worker: the models already live "
                        "in CPU memory")
        self.run_dir = Path(cfg.trainer.output_dir)
        self.resume_from = self._choose_checkpoint()  # before anything is written or loaded
        self.run_dir.mkdir(parents=True, exist_ok=True)
        library_output.install(str(self.run_dir), cfg.trainer.verbose)  # the libraries' output to libraries.log
        with self.startup("model_resolution"):
            self.model_path = resolve_model_path(cfg.model.path)
            self.plan = plan = plan_with_model(cfg, plan, self.model_path)  # before any weights load
            self.cfg = cfg = plan.run_config(cfg)  # what the workers read: nothing is written into the config
            self.batch_plan = plan.batch
            self.tokenizer = load_tokenizer(self.model_path, cfg.model.trust_remote_code)
        with self.startup("data"):
            self.train_data = PromptDataset(task_files(cfg.task, "train", cfg.data.train_files), self.tokenizer,
                                            cfg.data.max_prompt_length, cfg.data.apply_chat_template,
                                            cfg.data.system_prompt)
            check_verifiers([p.row for p in self.train_data.prompts], cfg.reward, "training data")
            # per-prompt pass statistics (seeded from data.pass_rate_file, cut to data.pass_rate_band) and the
            # sampler data.sampler names over the prompts kept (docs/curriculum.md)
            kept, self.prompt_stats = start_curriculum(cfg.data, [p.row for p in self.train_data.prompts])
            self.train_data.prompts = [self.train_data.prompts[i] for i in kept]
            self.sampler = make_sampler(cfg.data, [p.row for p in self.train_data.prompts], cfg.trainer.seed,
                                        self.prompt_stats)
            self.round_curriculum: Dict[str, float] = {}
            self.train_levels = data_levels([p.row for p in self.train_data.prompts])  # per-level metrics when 2+
        self.val_data: Optional[PromptDataset] = None
        self.progress: Optional[StepProgress] = None  # the training bar, while fit runs
        self.step = 0
        self.skipped_steps = SkippedStepGuard(cfg.trainer.max_skipped_steps)
        self.kl_ctrl = make_kl_controller(cfg.algorithm.kl_ctrl, cfg.algorithm.kl_coef, cfg.algorithm.kl_target,
                                          cfg.algorithm.kl_horizon)
        from reasonrl.logging import make_logger  # before the workers: a bad logger fails before any model loads

        self.logger = make_logger(cfg.trainer.logger, str(self.run_dir), to_dict(cfg), cfg.trainer.project,
                                  cfg.trainer.experiment)
        groups = backend.start(cfg, plan, self.model_path, self.startup)
        self.workers, self.critic, self.rollouts = groups.actor, groups.critic, groups.rollouts
        self.worker_info = groups.actor_info
        engine_starts = [i["engine_start_s"] for i in self.worker_info if i.get("engine_start_s") is not None]
        if engine_starts:
            self.startup.seconds["engine_start"] = max(engine_starts)
        self.pool = make_pool(cfg.reward, groups.layout)  # rule verifiers, and the reward model on its pool
        self.source = make_source(plan, groups, self.pool, cfg, self.draw)
        self._resume()
        self.source.start(self.step)  # the engines at the resumed weights; async: rounds started ahead

    # ------------------------------------------------------------------ set-up
    def _choose_checkpoint(self) -> Optional[Path]:
        """The checkpoint to resume from: the newest whose files verify (``trainer.resume=auto``; CheckpointError
        when the run has checkpoints and none verifies), the one named (CheckpointError naming its damaged file), or
        none (``never``, or no checkpoint yet)."""
        mode = self.cfg.trainer.resume
        if mode == "never":
            return None
        if mode == "auto":
            return usable_checkpoint(str(self.run_dir))
        verify_checkpoint(Path(mode))
        return Path(mode)

    def _resume(self) -> None:
        """Continue from ``self.resume_from``; rows of ``metrics.jsonl`` and the sample logs beyond the resumed step
        (logged by a run killed before its checkpoint was complete) are dropped, so every step is logged once. A run
        that starts over (``trainer.resume=never``, or no checkpoint yet) drops every row an earlier run left."""
        ckpt = self.resume_from  # None with trainer.resume=never (_choose_checkpoint)
        if ckpt is not None:
            self.workers.load_checkpoint(str(ckpt))
            if self.critic is not None:
                self.critic.load_checkpoint(str(ckpt))
            state = read_trainer_state(ckpt)
            self.step = int(state["step"])
            self.sampler.load_state_dict(state["sampler"])
            if "kl_ctrl" in state:  # checkpoints from before the controller keep the configured coefficient
                self.kl_ctrl.load_state_dict(state["kl_ctrl"])
            if "prompt_stats" in state:  # checkpoints from before the statistics start from the seeded ones
                self.prompt_stats.load_state_dict(state["prompt_stats"])
            self.source.load(str(ckpt))  # async: the rounds generated ahead of the checkpointed step
            print(f"resumed from {ckpt} at step {self.step} (data epoch {self.sampler.epoch}, "
                  f"offset {self.sampler.offset})", flush=True)
        keep_through = self.step if ckpt is not None else -1  # no checkpoint: step 0's validation is redone too
        for name in ("metrics.jsonl", SAMPLE_LOG, VAL_SAMPLE_LOG):
            dropped = drop_rows_after(self.run_dir / name, keep_through)
            if dropped:
                print(f"dropped {dropped} {name} row(s) logged after step {self.step} by an earlier run",
                      flush=True)

    def draw(self) -> Tuple[List[Any], List[int]]:
        """The next ``data.train_batch_size`` training prompts and their dataset positions (the sampler's draw)."""
        indices = self.sampler.next_indices()
        return [self.train_data[i] for i in indices], indices

    # ------------------------------------------------------------------ the loop
    def fit(self) -> None:
        """Train until ``trainer.total_steps``. Ctrl-C (or SIGTERM) stops at the next step boundary, after saving
        the step just finished; ``self.interrupted`` then says so (``reasonrl.train`` exits 130)."""
        t = self.cfg.trainer
        self.interrupted = False
        if t.watchdog_max_s > 0:  # one watchdog per group: each keeps its own phase durations
            for group in self.worker_groups():
                group.enable_watchdog(PhaseWatchdog(t.watchdog_factor, t.watchdog_min_s, t.watchdog_max_s),
                                      str(self.run_dir / "stacks"))
        with stop_at_boundary("finishing the step in flight, then saving a checkpoint and stopping") as stop:
            self._stop = stop
            if t.val_before_train and self.step == 0:
                self.logger.log(self.validate(), 0)
            self.progress = StepProgress(t.total_steps, self.step)  # the bar; a line per phase on the first step
            try:
                while self.step < t.total_steps and not stop.requested:
                    fault_point("step.begin")
                    metrics = self.train_step()
                    self.step += 1
                    if self.startup is not None:  # the first step of this process: how long start-up took
                        metrics.update(startup_metrics(self.startup.seconds, metrics))
                        self.startup = None
                    if t.val_every and self.step % t.val_every == 0:
                        metrics.update(self.validate())
                    self.logger.log(metrics, self.step)
                    self.progress.step_done()
                    if (t.save_every and self.step % t.save_every == 0) or self.step == t.total_steps \
                            or stop.requested:
                        self.save()
            finally:
                self.progress.close()
            self.interrupted = stop.requested and self.step < t.total_steps

    @property
    def stop_signal(self) -> str:
        """The signal that asked ``fit`` to stop ("SIGTERM", "SIGINT"), or "" when none did."""
        return self._stop.signal_name if self._stop is not None else ""

    def train_step(self) -> Dict[str, Any]:
        cfg, alg = self.cfg, self.cfg.algorithm
        timer = PhaseTimer(self.progress.phase if self.progress is not None else None)
        with timer("step"):
            rnd, metrics = self.take_round(timer)
            fault_point("step.round_taken")
            samples, results = rnd.samples, rnd.results
            batch = with_version_lag(collate_samples(samples, self.tokenizer.pad_token_id), samples, self.step)
            check_failed_fraction(results, [s.verifier for s in samples], cfg.reward.max_failed_fraction,
                                  self.step + 1)
            verdicts = verdict_mask(results)  # failed responses: out of the advantages and the loss, counted
            baseline = None
            if alg.adv_estimator == "remax":  # ReMax: a greedy response's reward per prompt is the baseline
                baseline, baseline_ok = self.greedy_baseline(rnd.prompts, timer)
                verdicts &= baseline_ok[rnd.group_index()]  # no baseline verdict: the group is left out
                metrics["remax/baseline_reward_mean"] = float(baseline.mean())
            if not bool(verdicts.all()):
                batch["loss_mask"] = without_failed(loss_mask(batch), verdicts)
            scores = torch.tensor([r.score for r in results], dtype=torch.float32)
            metrics.update({**round_metrics(samples, scores, batch["response_mask"], verdicts),
                            **failure_metrics(results, [s.verifier for s in samples]), **self.round_curriculum})
            if alg.overlong_buffer > 0:
                scores = scores + overlong_penalty(batch["response_mask"].sum(-1).long(), cfg.rollout.max_new_tokens,
                                                   alg.overlong_buffer, alg.overlong_penalty)
            batch = self.teacher_forced_passes(batch, metrics, timer)
            with timer("advantages"):
                batch["advantages"], batch["returns"] = self.advantages(batch, scores, verdicts, rnd, baseline)
            metrics.update(self.update_and_publish(batch, timer))
            if cfg.rollout.check_weight_sync:
                metrics.update(self.source.check_weight_sync(samples[0].prompt_ids, samples[0].response_ids))
        metrics.update(self.step_kl_coef(metrics, len(batch)))
        metrics.update(self.step_tail_metrics(timer, loss_mask(batch), batch))
        if cfg.trainer.log_samples_every and (self.step + 1) % cfg.trainer.log_samples_every == 0:
            self.log_samples(samples)
        return metrics

    def take_round(self, timer: PhaseTimer) -> Tuple[Round, Dict[str, float]]:
        """This step's verified round from the source; with DAPO's dynamic sampling, refilled with informative
        groups from further rounds. Each round's verdicts go into the per-prompt statistics."""
        alg, plan = self.cfg.algorithm, self.plan
        rnd = self.record_round(self.source.next_round(self.step, timer))
        metrics = dict(self.source.round_metrics())
        if alg.dynamic_sampling:  # DAPO: train only on groups whose rewards differ; refill from more prompts
            rnd, refill = refill_informative_groups(
                rnd, lambda: self.record_round(self.source.next_round(self.step, timer)), plan.batch.prompts_per_step,
                alg.max_resample_rounds, plan.world_size, plan.batch.mini_batch_prompts)
            metrics.update(refill)
        return rnd, metrics

    def teacher_forced_passes(self, batch: Batch, metrics: Dict[str, float], timer: PhaseTimer) -> Batch:
        """The passes the plan runs (old log-probs, reference log-probs, values) and their metrics."""
        passes = self.plan.passes
        if passes.old_log_probs:  # else the update uses its own log-probs (config/passes.py)
            with timer("old_log_probs"):
                batch = batch.union(self.workers.compute_log_probs(batch))
        if passes.ref_log_probs:
            with timer("ref_log_probs"):
                batch = batch.union(self.workers.compute_ref_log_probs(batch))
        if passes.values:
            with timer("values"):
                batch = batch.union(self.critic.compute_values(batch))
        if passes.old_log_probs:
            mask = loss_mask(batch)  # response tokens the policy produced (tool turns left out)
            ref = batch["ref_log_probs"] if passes.ref_log_probs else None
            metrics.update(policy_metrics(batch["old_log_probs"], ref, batch["entropy"], mask))
            if self.plan.rollout_logprobs:  # the engine's log-probs against the pass's: gap and importance weights
                metrics.update(behaviour_gap_metrics(self.cfg, batch, mask))
        return batch

    def advantages(self, batch: Batch, scores: torch.Tensor, verdicts: torch.Tensor, rnd: Round,
                   baseline: Optional[torch.Tensor]):
        """(advantages, returns) of the estimator over the verdicts; KL-shaped token rewards with kl_in_reward."""
        alg, mask = self.cfg.algorithm, loss_mask(batch)
        group_index = rnd.group_index()
        token_rewards = None
        if alg.kl_in_reward:
            token_rewards = kl_shaped_token_rewards(
                scores, kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], alg.kl_reward_estimator), mask,
                self.kl_ctrl.kl_coef)
        return advantages_over_verdicts(
            lambda **kw: compute_advantages(alg.adv_estimator, **kw), verdicts, scores=scores, mask=mask,
            group_index=group_index, token_rewards=token_rewards, gamma=alg.gamma, lam=alg.lam,
            norm_by_std=alg.norm_by_std, values=batch["values"] if self.plan.passes.values else None,
            baseline_scores=None if baseline is None else baseline[group_index], pass_k=alg.pass_k)

    def update_and_publish(self, batch: Batch, timer: PhaseTimer) -> Dict[str, float]:
        """The critic's and the actor's updates (the actor waits out the critic's warm-up), then the new weights to
        the engines through the source (or the engines back as they were when nothing was updated)."""
        metrics: Dict[str, float] = {}
        self.source.release_devices(timer)
        if self.critic is not None:
            with timer("update_critic"):
                metrics.update(self.critic.update_critic(batch))
        if self.critic is not None and self.step < self.cfg.critic.warmup_steps:
            metrics.update(self.source.publish(None, timer))  # no new weights: the engines come back as they were
            return metrics
        with timer("update_actor"):
            update = self.workers.update_actor(batch, kl_coef=self.kl_ctrl.kl_coef)
        fault_point("step.updated")
        self.skipped_steps.observe(update, self.step + 1)  # a run of steps that updated nothing stops
        if not self.plan.rollout_logprobs:  # without the engine's log-probs the mismatch means nothing
            update = {k: v for k, v in update.items() if not k.startswith(("rollout/logprob_diff", "offpolicy/"))}
        metrics.update(update)
        metrics.update(self.source.publish(self.step + 1, timer))
        fault_point("step.published")
        return metrics

    def step_tail_metrics(self, timer: PhaseTimer, mask: torch.Tensor, batch: Batch) -> Dict[str, float]:
        """The pool's counters, the phase timings (offload's slowest rank), throughput and the data epoch."""
        metrics = {**self.pool.pop_stats(), **timer.metrics()}
        if self.plan.offload:  # parts of the phases above: timing_s/{offload,onload}_{actor,ref,critic}
            metrics.update(slowest_rank(self.workers.pop_offload_timing()))
            if self.critic is not None:
                metrics.update(slowest_rank(self.critic.pop_offload_timing()))
        metrics["perf/rollout_tokens_per_s"] = float(mask.sum()) / max(timer.seconds["rollout"], 1e-9)
        metrics["perf/tokens_per_s"] = float(batch["attention_mask"].sum()) / max(timer.seconds["step"], 1e-9)
        metrics["data/epoch"] = self.sampler.epoch
        return metrics

    def log_samples(self, samples: List[Sample]) -> None:
        """The first two groups' prompts, responses and verdicts to the sample log (``trainer.log_samples_every``;
        its fields: ``reasonrl.logging.sample_log``)."""
        self.logger.log_samples(self.sample_rows([s for s in samples if s.group < 2]), self.step + 1)

    def sample_rows(self, samples: List[Sample]) -> List[Dict[str, Any]]:
        """The sample log's rows of ``samples`` (``reasonrl.logging.sample_log``)."""
        from reasonrl.envs.metrics import conversation_text

        return [sample_log_row(
            self.tokenizer.decode(s.prompt_ids, skip_special_tokens=True), s.response_text, s.result.score,
            s.verifier, s.result.failed, s.result.info.get("reason", ""), s.result.correct, s.prompt.row,
            len(s.response_ids), s.finish_reason, level=level_of(s.prompt.row),
            weights_version=s.weights_version, newest_version=s.newest_version,
            conversation=conversation_text(s.env.conversation) if s.env and s.env.conversation else None)
            for s in samples]

    def worker_groups(self) -> List[WorkerGroup]:
        """Every worker group of the run (each gets a watchdog and its stack dumps)."""
        return [g for g in (self.workers, self.critic, self.rollouts) if g is not None]

    def step_kl_coef(self, metrics: Dict[str, Any], responses: int) -> Dict[str, float]:
        """``actor/kl_coef`` used this step; with ``algorithm.kl_ctrl=adaptive`` the controller then moves it towards
        ``kl_target`` from the step's mean per-token KL (``actor/kl``) over ``responses`` samples."""
        used = self.kl_ctrl.kl_coef
        if "actor/kl" in metrics:
            self.kl_ctrl.update(float(metrics["actor/kl"]), responses)
        return {"actor/kl_coef": used}

    def greedy_baseline(self, prompts: List[Any], timer: PhaseTimer):
        """ReMax's baseline: one greedy response per prompt, verified. Returns ([P] scores, [P] bool: got a verdict)."""
        with timer("baseline_rollout"):
            samples = self.source.generate_verified(prompts, {**self.plan.validation_sampling, "temperature": 0.0})
        return (torch.tensor([s.result.score for s in samples], dtype=torch.float32),
                torch.tensor([not s.result.failed for s in samples], dtype=torch.bool))

    def record_round(self, rnd: Round) -> Round:
        """The round's verdicts into the per-prompt statistics (``curriculum/*`` metrics as the round was drawn, and
        the round's mix: ``levels/*``)."""
        self.round_curriculum = {**curriculum_metrics(self.prompt_stats, self.sampler, rnd.indices),
                                 **round_level_metrics(rnd, self.train_levels)}
        self.prompt_stats.update(rnd.indices, group_verdicts(rnd), self.step + 1)
        return rnd

    def validate(self) -> Dict[str, float]:
        cfg = self.cfg
        if self.val_data is None:
            self.val_data = PromptDataset(task_files(cfg.task, "val", cfg.data.val_files), self.tokenizer,
                                          cfg.data.max_prompt_length, cfg.data.apply_chat_template,
                                          cfg.data.system_prompt, limit=cfg.data.val_limit)
        samples: List[Sample] = []
        chunk = max(self.world_size, cfg.data.val_batch_size - cfg.data.val_batch_size % self.world_size)
        with validation_bar(len(self.val_data)) as bar:
            for start in range(0, len(self.val_data), chunk):
                prompts = [self.val_data[i] for i in range(start, min(start + chunk, len(self.val_data)))]
                samples += self.source.generate_verified(prompts, self.plan.validation_sampling)
                bar.set_postfix_str(f"acc {sum(bool(s.result.correct) for s in samples) / len(samples):.3f}",
                                    refresh=False)
                bar.update(len(prompts))
        if cfg.trainer.log_val_samples:  # at the step the weights were trained to (0: before training)
            self.logger.log_val_samples(self.sample_rows(samples[:cfg.trainer.log_val_samples]), self.step)
        results = [s.result for s in samples]
        judged = [r for r in results if not r.failed]
        out = {"val/failed": float(len(results) - len(judged)),
               **val_level_metrics([s.prompt.row for s in samples], results), **validation_env_metrics(samples)}
        if judged:  # over the verdicts; with none at all the means are left out rather than reported as 0
            out["val/reward_mean"] = sum(r.score for r in judged) / len(judged)
            out["val/accuracy"] = sum(bool(r.correct) for r in judged) / len(judged)
        return out

    def save(self) -> Path:
        state = {"step": self.step, "sampler": self.sampler.state_dict(), "world_size": self.world_size,
                 "kl_ctrl": self.kl_ctrl.state_dict(), "prompt_stats": self.prompt_stats.state_dict()}
        def write_workers(directory: str) -> None:
            self.source.save(directory)  # async: the rounds generated ahead (waited for first)
            self.workers.save_checkpoint(directory)
            if self.critic is not None:
                self.critic.save_checkpoint(directory)  # into <checkpoint>/critic/

        path = save_checkpoint(str(self.run_dir), self.step, write_workers, state, to_yaml(self.cfg),
                               self.cfg.trainer.keep_checkpoints)
        return path

    def close(self) -> None:
        self.source.close()
        self.pool.close()
        self.logger.close()
        self.workers.shutdown()
        if self.critic is not None:
            self.critic.shutdown()
        library_output.uninstall()
