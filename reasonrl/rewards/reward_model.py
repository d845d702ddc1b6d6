"""``reward.model``: a Hugging Face sequence-classification model scoring (prompt, response) pairs on Ray actors of
its own (the layout's ``reward_model`` pool).

A pair is the row's prompt messages plus the response as the assistant's turn, rendered with the reward model's own
chat template (its tokenizer), cut from the left to ``max_length`` tokens. A batch is right-padded; the score of a
pair is the head's output at its last real token (``sigmoid`` of it by default). The actors are data-parallel copies
(``workers`` of the pool); batches go to them in turn. An actor that dies, raises or does not answer within
``timeout_s`` fails the batch's samples (named); a pool given GPUs on a machine where CUDA is unavailable refuses to
start instead of falling back to the CPU.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from reasonrl.config.reward_sources_schema import RewardModelConfig
from reasonrl.verifiers import VerifyResult

from .handles import batched, score_problem
from .items import prompt_messages
from .registry import RewardSource, register_reward_source

Pair = Tuple[List[Dict[str, str]], str]
"""(prompt messages, response)."""


def encode_pairs(tokenizer: Any, pairs: Sequence[Pair], max_length: int) -> List[List[int]]:
    """Token ids of each pair: the chat template over the prompt and the response (as the assistant's turn), the
    last ``max_length`` tokens."""
    out = []
    for messages, response in pairs:
        chat = list(messages) + [{"role": "assistant", "content": response}]
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(chat, tokenize=False)
        else:
            text = "\n".join(m["content"] for m in chat)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(ids[-max_length:])
    return out


class RewardModelWorker:
    """One data-parallel copy of the reward model (a Ray actor: ``ray.remote(RewardModelWorker)``)."""

    def __init__(self, path: str, dtype: str, max_length: int, device: str, num_threads: int = 1) -> None:
        """Load ``path`` (AutoModelForSequenceClassification, one label) on ``device`` (cpu, or cuda: RuntimeError
        when CUDA is not available: never a silent CPU fallback)."""
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("the reward_model pool has GPUs but CUDA is not available in its worker: refusing to "
                               "run the reward model on the CPU (set placement.pools.<pool>.gpus=0 to mean it)")
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.set_num_threads(max(1, int(num_threads)))
        self.device = device
        self.max_length = int(max_length)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=getattr(torch, dtype))
        if self.model.config.num_labels != 1:
            raise ValueError(f"reward.model.path={path}: the model has {self.model.config.num_labels} labels; a "
                             f"reward model has one (its logit is the score)")
        head = getattr(self.model, "score", None) or getattr(self.model, "classifier", None)
        if head is None:
            raise ValueError(f"reward.model.path={path}: {type(self.model).__name__} has no 'score' head")
        self.head = head
        self.model.to(device).eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def info(self) -> Dict[str, Any]:
        """Where this copy runs (the tests check the placement)."""
        import ray

        return {"device": self.device, "node": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def score(self, pairs: Sequence[Pair]) -> List[float]:
        """The head's logit at each pair's last token, in order."""
        import torch

        ids = encode_pairs(self.tokenizer, pairs, self.max_length)
        width = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, x in enumerate(ids):
            input_ids[i, :len(x)] = torch.tensor(x, dtype=torch.long)
            mask[i, :len(x)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        with torch.no_grad():
            hidden = self.model.base_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            logits = self.head(hidden)[..., 0].float()  # [B, T]
        last = mask.sum(-1) - 1
        return logits[torch.arange(len(ids), device=logits.device), last].cpu().tolist()


def to_score(logit: float, transform: str) -> float:
    """The reward from a logit: its sigmoid, or itself (``raw``)."""
    if transform == "raw":
        return float(logit)
    return 1.0 / (1.0 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1.0 + math.exp(logit))


class RayBatchHandle:
    """The results of batches sent to reward-model actors (object refs), in input order."""

    def __init__(self, source: "RewardModelSource", count: int, parts: List[Tuple[List[int], Any, int]]) -> None:
        self.source = source
        self.count = count
        self.parts = parts  # (indices, object ref, actor index)
        self._results: Optional[List[VerifyResult]] = None

    def __len__(self) -> int:
        return self.count

    def done(self) -> bool:
        import ray

        if self._results is not None or not self.parts:
            return True
        refs = [ref for _, ref, _ in self.parts]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(ready) == len(refs)

    def result(self) -> List[VerifyResult]:
        if self._results is None:
            out: List[VerifyResult] = [VerifyResult.failure("reward_model: no result")] * self.count
            for indices, ref, actor in self.parts:
                for i, r in zip(indices, self.source.collect(ref, actor, len(indices))):
                    out[i] = r
            self._results = out
        return self._results


@register_reward_source("model")
class RewardModelSource(RewardSource):
    """Ray actors holding the reward model; ``submit(items)`` sends batches of ``batch_size`` pairs round-robin."""

    label = "reward_model"
    order = 1
    schema = RewardModelConfig
    settings_key = "reward.model"
    switch = "path"

    def __init__(self, cfg: RewardModelConfig, score_range: Sequence[float], layout: Any = None) -> None:
        """``layout``: the run's ``controller.layout.Layout`` (its ``reward_model`` pool); None: one worker, on a
        GPU of its own when the cluster has GPUs, else time-sharing the CPU cores."""
        import ray

        from reasonrl.controller import start_ray
        from reasonrl.controller.layout import Layout, Pool, reserve_pool, role_options
        from reasonrl.models import resolve_model_path

        self.cfg = cfg
        self.score_range = tuple(score_range)
        start_ray(None)
        if layout is None:
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
            layout = Layout({"reward": Pool("reward", 1, gpus, gpus, ("reward_model",))}, {"reward_model": "reward"})
        self.pool = layout.pool_of("reward_model")
        path = resolve_model_path(cfg.path)
        device = "cuda" if self.pool.gpus > 0 else "cpu"
        threads = max(1, int(self.pool.cpus)) if self.pool.cpus else 1
        self.group = reserve_pool(self.pool) if (self.pool.gpus > 0 or self.pool.cpus > 0) else None
        cls = ray.remote(RewardModelWorker)
        self.actors = []
        for rank in range(self.pool.workers):
            options = role_options(layout, "reward_model", rank, self.group) if self.group is not None \
                else {"num_cpus": 0}
            self.actors.append(cls.options(**options).remote(path, cfg.dtype, cfg.max_length, device, threads))
        self._next = 0
        self._lock = threading.Lock()  # submit, collect and pop_stats may run on different threads
        self._stats = {"requests": 0, "errors": 0}

    @classmethod
    def from_config(cls, settings: RewardModelConfig, reward: Any, layout: Any = None) -> "RewardModelSource":
        return cls(settings, reward.score_range, layout)

    def submit(self, items: Sequence[Any]) -> RayBatchHandle:
        parts = []
        for indices in batched(range(len(items)), int(self.cfg.batch_size)):
            pairs = [(prompt_messages(items[i].row), items[i].response) for i in indices]
            with self._lock:
                actor = self._next % len(self.actors)
                self._next += 1
                self._stats["requests"] += 1
            parts.append((indices, self.actors[actor].score.remote(pairs), actor))
        return RayBatchHandle(self, len(items), parts)

    def collect(self, ref: Any, actor: int, count: int) -> List[VerifyResult]:
        """One batch's results: verdicts, or failures naming the actor when it died, raised or timed out."""
        import ray

        try:
            logits = ray.get(ref, timeout=float(self.cfg.timeout_s))
        except ray.exceptions.GetTimeoutError:
            self._count_error()
            return [VerifyResult.failure(f"reward_model actor {actor}: no scores within reward.model.timeout_s="
                                         f"{self.cfg.timeout_s:g}s", timed_out=True)] * count
        except ray.exceptions.RayError as exc:
            self._count_error()
            first = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
            return [VerifyResult.failure(f"reward_model actor {actor} failed: {type(exc).__name__}: {first}")] * count
        out = []
        for logit in logits:
            score = to_score(logit, self.cfg.transform)
            problem = score_problem(score, self.score_range)
            out.append(VerifyResult.failure(f"reward_model: {problem}", logit=logit) if problem else
                       VerifyResult(score=score, correct=score >= float(self.cfg.correct_above),
                                    info={"reason": "reward model", "logit": float(logit)}))
        return out

    def _count_error(self) -> None:
        with self._lock:
            self._stats["errors"] += 1

    def info(self) -> List[Dict[str, Any]]:
        """Each actor's device, node and GPU ids."""
        import ray

        return ray.get([a.info.remote() for a in self.actors])

    def pop_stats(self) -> Dict[str, float]:
        with self._lock:
            stats, self._stats = self._stats, {"requests": 0, "errors": 0}
        return {f"reward_source/reward_model/{k}": float(v) for k, v in stats.items()}

    def close(self) -> None:
        import ray

        if not ray.is_initialized():  # Ray shut down first: its actors and groups went with it
            self.actors, self.group = [], None
            return
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.group is not None:
            ray.util.remove_placement_group(self.group)
            self.group = None
