"""Offline evaluation: sample n responses per problem, verify them, checkpoint each batch, report pass@k / maj@k.

The engine runs in this process (no Ray). Problems are processed in batches of ``eval.batch_size``; after each
batch its verified samples are appended to ``samples.jsonl`` (see ``store.py``), so an interrupt or an engine
crash loses at most the batch in flight, and running the same command again resumes from the stored samples.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence

from reasonrl.config.schema import Config

from .plan import EvalError, EvalPlan
from .metrics import BREAKDOWN_KEYS, ProblemOutcome, majority_vote, pass_at_k, summarize
from reasonrl.fault_points import fault_point
from reasonrl.interrupt import stop_at_boundary

from .store import SampleStore

log = logging.getLogger(__name__)


def resolve_eval_model(path: str) -> str:
    """A loadable model directory for ``model.path``: a training checkpoint directory resolves to its ``hf/``
    export, a training run directory to the export of its latest checkpoint (step numbers are zero-padded, so
    name order is step order); a PEFT adapter directory (``adapter_config.json``: a LoRA checkpoint's ``adapter/``)
    to its base model with the adapter merged in (built once, cached; ``models.lora.merged_model_dir``); a hub id or
    the default model resolves as in training (``resolve_model_path``)."""
    from reasonrl.models import resolve_model_path
    from reasonrl.models.lora import is_adapter_dir, merged_model_dir

    if os.path.isdir(path) and is_adapter_dir(path):
        try:
            merged = merged_model_dir(path)
        except (OSError, ValueError) as exc:
            raise EvalError(f"model.path={path} is a LoRA adapter directory that cannot be applied: {exc}") from None
        log.info("model.path=%s is a LoRA adapter; evaluating its base with the adapter merged (%s)", path, merged)
        return merged
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json")):
        export = os.path.join(path, "hf")
        if os.path.exists(os.path.join(export, "config.json")):
            return os.path.abspath(export)
        steps = sorted(f for f in glob.glob(os.path.join(path, "checkpoints", "step_*", "hf", "config.json"))
                       if re.fullmatch(r"step_\d+", os.path.basename(os.path.dirname(os.path.dirname(f)))))
        if steps:  # a training run directory: its latest checkpoint
            latest = os.path.dirname(steps[-1])
            log.info("model.path=%s is a training run; evaluating its latest checkpoint %s", path, latest)
            return os.path.abspath(latest)
        raise EvalError(f"model.path={path} is a directory with neither config.json nor hf/config.json "
                        f"(a Hugging Face model directory, a training checkpoint directory or a training run "
                        f"directory with checkpoints/step_*/hf is expected)")
    resolved = resolve_model_path(path)
    return os.path.abspath(resolved) if os.path.isdir(resolved) else resolved


def prompt_fingerprint(token_ids: Sequence[int]) -> str:
    """A short hash of a prompt's token ids: ties a stored record to the exact prompt it answered."""
    return hashlib.sha1(json.dumps(list(token_ids)).encode()).hexdigest()[:16]


def problem_groups(row: Dict[str, Any]) -> Dict[str, Optional[str]]:
    """Breakdown keys of a row: data_source, and subject / level from extra_info (or the row itself)."""
    extra = row.get("extra_info") or {}
    groups: Dict[str, Optional[str]] = {}
    for key in BREAKDOWN_KEYS:
        value = row.get(key) if row.get(key) is not None else extra.get(key)
        groups[key] = None if value is None else str(value)
    return groups


def _as_text(value: Any) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _question(row: Dict[str, Any]) -> str:
    users = [m["content"] for m in row.get("prompt") or [] if m.get("role") == "user"]
    return users[-1] if users else ""


def problem_record(index: int, token_ids: Sequence[int], row: Dict[str, Any], completions, results) -> Dict[str, Any]:
    """The stored form of one verified problem: identification, then one parallel list entry per sample.

    A sample without a verdict (``VerifyResult.failed``: a timeout, a crash, a non-finite score, ...) is recorded as
    incorrect (score 0, no extracted answer, so no maj@k vote) with ``failed`` set, and ``timed_out`` too when it
    timed out."""
    record: Dict[str, Any] = {
        "problem": index,
        "prompt_sha": prompt_fingerprint(token_ids),
        "index": (row.get("extra_info") or {}).get("index"),
        **problem_groups(row),
        "question": _question(row),
        "ground_truth": _as_text(row["reward_model"]["ground_truth"]),
        "responses": [], "finish_reasons": [], "num_tokens": [], "extracted": [], "correct": [], "scores": [],
        "reasons": [], "timed_out": [], "failed": [],
    }
    for completion, result in zip(completions, results):
        info = dict(result.info or {})
        timed_out = bool(info.get("timed_out"))
        failed = timed_out or bool(getattr(result, "failed", False))
        record["responses"].append(completion.text)
        record["finish_reasons"].append(completion.finish_reason)
        record["num_tokens"].append(len(completion.token_ids))
        record["extracted"].append(None if failed else _as_text(info.get("extracted")))
        record["correct"].append(bool(result.correct) and not failed)
        record["scores"].append(0.0 if failed else float(result.score))
        record["reasons"].append(str(info.get("reason") or ("timed out" if timed_out else "")))
        record["timed_out"].append(timed_out)
        record["failed"].append(failed)
    return record


def outcome_of(record: Dict[str, Any]) -> ProblemOutcome:
    """The metrics' view of a stored record."""
    return ProblemOutcome(correct=list(record["correct"]), answers=list(record["extracted"]),
                          timed_out=list(record["timed_out"]),
                          failed=list(record.get("failed", record["timed_out"])),  # stores older than the column
                          groups={k: record.get(k) for k in BREAKDOWN_KEYS if record.get(k) is not None})


def table_row(record: Dict[str, Any], ks: Sequence[int]) -> Dict[str, Any]:
    """A samples.parquet row: the record plus its per-problem num_correct, majority answer, pass@k, maj@k."""
    n, c = len(record["correct"]), sum(record["correct"])
    row = dict(record)
    row["num_correct"] = c
    row["majority_answer"], row["majority_correct"] = majority_vote(record["extracted"], record["correct"])
    for k in ks:
        row[f"pass@{k}"] = pass_at_k(n, c, k)
    for k in ks:
        row[f"maj@{k}"] = float(majority_vote(record["extracted"][:k], record["correct"][:k])[1])
    return row


def _sample_and_verify(cfg: Config, plan: EvalPlan, dataset, todo: List[int], done: Dict[int, Dict[str, Any]],
                       store: SampleStore, model_path: str, tokenizer, timing: Dict[str, float],
                       echo: Callable[[str], None]) -> None:
    """Sample and verify the ``todo`` problems batch by batch, appending each verified batch to ``store``."""
    from tqdm import tqdm

    from reasonrl.models import torch_dtype
    from reasonrl.rewards import make_pool, verify_item
    from reasonrl.rollout import SamplingParams, make_rollout_engine

    e = cfg.eval
    sampling = SamplingParams(**plan.sampling)
    engine = pool = bar = tools = None
    with stop_at_boundary("finishing the batch in flight and saving its samples, then stopping") as stop:
        try:
            engine = make_rollout_engine(replace(cfg.rollout, engine=plan.engine), model_path, tokenizer,
                                         torch_dtype(cfg.model.dtype, plan.device), plan.device, plan.max_model_len)
            generator = engine
            if plan.generator == "tools":  # multi-turn: the model's tool calls run in the sandbox (docs/tools.md)
                from reasonrl.rollout.multiturn import ToolRollout

                generator = tools = ToolRollout.from_config(engine, tokenizer, cfg)
            pool = make_pool(cfg.reward)
            bar = tqdm(total=len(dataset), initial=len(done), unit="problem", desc="eval", dynamic_ncols=True)
            for start in range(0, len(todo), e.batch_size):
                batch = todo[start:start + e.batch_size]
                bar.set_description("sampling")
                sampling.seed = cfg.trainer.seed + batch[0]
                t0 = time.time()
                prompt_ids = [dataset[i].token_ids for i in batch]
                if tools is not None:  # each prompt's environment is reset with its own row
                    outputs = tools.generate(prompt_ids, sampling, rows=[dataset[i].row for i in batch])
                else:
                    outputs = generator.generate(prompt_ids, sampling)
                timing["generate_s"] += time.time() - t0
                bar.set_description("verifying")
                items = [verify_item(dataset[i].row, c.text, cfg.reward)
                         for i, comps in zip(batch, outputs) for c in comps]
                t0 = time.time()
                results = pool.verify_batch(items)
                timing["verify_s"] += time.time() - t0
                records = [problem_record(i, dataset[i].token_ids, dataset[i].row, comps,
                                          results[j * e.n:(j + 1) * e.n])
                           for j, (i, comps) in enumerate(zip(batch, outputs))]
                store.append(records)
                done.update((r["problem"], r) for r in records)
                fault_point("eval.batch_stored")  # test hook (REASONRL_FAULT_AT): interrupt after an exact batch
                bar.update(len(batch))
                correct = sum(sum(r["correct"]) for r in done.values())
                bar.set_postfix(acc=f"{correct / (len(done) * e.n):.3f}")
                if stop.requested:
                    raise KeyboardInterrupt  # at the boundary: every verified batch is on disk
            bar.set_description("done")
        except BaseException:
            if bar is not None:
                bar.close()
                bar = None
            echo(f"stopped: {len(done)} of {len(dataset)} problems are verified and saved in {store.samples_path}; "
                 f"run the same command again to resume")
            raise
        finally:
            if bar is not None:
                bar.close()
            if tools is not None:  # the tool loop's sandbox sessions first, then the verifier pool and the engine
                tools.close()
            if pool is not None:
                pool.close()
            if engine is not None:
                engine.shutdown()


def run_eval(cfg: Config, echo: Callable[[str], None] = print) -> Dict[str, Any]:
    """Evaluate ``cfg.model.path`` on ``cfg.task``; returns the summary (also written to summary.json)."""
    from reasonrl.data import PromptDataset
    from reasonrl.datasets import task_files
    from reasonrl.models import load_tokenizer
    from reasonrl.rewards import check_verifiers

    plan = EvalPlan.build(cfg)  # sampling, device, engine: checked before anything loads
    e = cfg.eval
    started = time.time()
    model_path = resolve_eval_model(cfg.model.path)
    explicit = cfg.data.val_files if plan.split == "val" else cfg.data.train_files
    files = [os.path.abspath(f) for f in task_files(cfg.task, plan.split, explicit)]
    try:
        tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    except Exception as exc:  # a missing directory, an unknown hub id offline, a broken export
        raise EvalError(f"cannot load a tokenizer from model.path={cfg.model.path} ({model_path}): "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    try:
        dataset = PromptDataset(files, tokenizer, cfg.data.max_prompt_length, cfg.data.apply_chat_template,
                                cfg.data.system_prompt, limit=e.limit)
    except ValueError as exc:  # no prompts left after the length filter
        raise EvalError(str(exc)) from None
    verifier_names = check_verifiers([p.row for p in dataset.prompts], cfg.reward, f"task {cfg.task!r}")

    store = SampleStore(e.output_dir)
    store.check_settings({
        "model_path": model_path, "task": cfg.task, "split": e.split, "files": files, "n": e.n,
        "temperature": e.temperature, "top_p": e.top_p, "max_new_tokens": e.max_new_tokens,
        "system_prompt": cfg.data.system_prompt, "apply_chat_template": cfg.data.apply_chat_template,
        **({"tool": {**vars(cfg.tool), "max_turns": cfg.rollout.max_turns}} if plan.generator == "tools" else {}),
    })
    stored = store.load()
    done: Dict[int, Dict[str, Any]] = {}
    for i, prompt in enumerate(dataset.prompts):
        record = stored.get(i)
        if record is None:
            continue
        if record.get("prompt_sha") != prompt_fingerprint(prompt.token_ids) or len(record["correct"]) != e.n:
            raise EvalError(f"{store.samples_path}: problem {i} was sampled for a different prompt or n; use "
                            f"another eval.output_dir, or delete the file to start over")
        done[i] = record
    todo = [i for i in range(len(dataset)) if i not in done]
    if done:
        echo(f"resuming: {len(done)} of {len(dataset)} problems already verified in {store.samples_path}")

    timing = {"generate_s": 0.0, "verify_s": 0.0}
    if todo:
        _sample_and_verify(cfg, plan, dataset, todo, done, store, model_path, tokenizer, timing, echo)

    records = [done[i] for i in range(len(dataset))]
    summary: Dict[str, Any] = {
        "task": cfg.task, "model": cfg.model.path, "model_path": model_path, "split": e.split, "files": files,
        "n": e.n, "k": list(e.k), "temperature": e.temperature, "top_p": e.top_p,
        "max_new_tokens": e.max_new_tokens, "limit": e.limit, "engine": plan.engine if todo else None, "verifiers": verifier_names,
        "prompts_dropped_too_long": dataset.dropped,
        "resumed_problems": len(dataset) - len(todo), "generated_problems": len(todo),
        "metrics": summarize([outcome_of(r) for r in records], e.k),
        "timing_s": {**{k: round(v, 3) for k, v in timing.items()}, "total_s": round(time.time() - started, 3)},
        "samples_parquet": str(store.parquet_path),
    }
    store.write_parquet([table_row(r, e.k) for r in records])
    store.write_summary(summary)
    return summary
