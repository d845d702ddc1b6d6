"""The ``vllm`` RolloutEngine: vLLM's offline engine running inside the worker's own process.

vLLM V1 normally runs its engine core in a child process; with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` it runs
in the caller's process, so the model lives next to the FSDP actor (the hybrid engine) and new weights are
handed over as tensors, not through files or sockets.

Weight sync (``update_weights``) takes Hugging Face names and full tensors; vLLM's own ``load_weights`` of
each model class maps them onto its fused layers (q/k/v -> ``qkv_proj``, gate/up -> ``gate_up_proj``, tied
``lm_head`` skipped), so no name table is kept here. How the tensors get in depends on the platform:

* GPU: ``model.load_weights`` copies straight into the parameters.
* CPU: after loading, vLLM repacks each linear weight into a kernel format (oneDNN / packed GEMM) and
  drops the plain weight, so ``load_weights`` alone would write into empty tensors. Instead the layerwise
  reload of ``Worker.reload_weights`` is used: layers go back to their checkpoint layout, weights are
  buffered per layer, and a layer is re-processed (repacked) once all its parts have arrived. One reload
  session spans all buckets of a sync, so q, k and v may come in different buckets; the session is
  finished before the engine is next used (or by ``finish_weight_update``).
"""
from __future__ import annotations

import logging
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vllm is imported: run the engine in-process

from typing import Callable, FrozenSet, Iterable, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402

from reasonrl.config.device_defaults import enforce_eager_for  # noqa: E402
from reasonrl.config.schema import RolloutConfig  # noqa: E402
from reasonrl.models.loader import ties_word_embeddings  # noqa: E402
from reasonrl.rollout import vllm_compat, vllm_stepper  # noqa: E402
from reasonrl.rollout.base import SLEEP_PARTS, Completion, SamplingParams, count_steps  # noqa: E402
from reasonrl.rollout.weight_sync import normalize_param_name, tensor_nbytes  # noqa: E402

log = logging.getLogger(__name__)

GIB = 1 << 30
LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _ReloadNoiseFilter(logging.Filter):
    """Drop vLLM's "<layer>: Failed to load weights" on every reload where it is expected: for the rotary
    embedding (a computed buffer that no checkpoint carries; vLLM puts the old one back, which is right) and, for a
    model with tied word embeddings, for the output head (``ParallelLMHead``: it shares the embedding's weight and
    has none of its own in a checkpoint; vLLM puts back the shared tensor, which the reload updated in place, and on
    CPU ``vllm_compat`` re-ties it. tests/e2e/test_vllm_engine.py::test_sync_reaches_the_tied_output_head checks that
    the head scores with the new embedding after a sync)."""

    def __init__(self, tied_head: bool) -> None:
        super().__init__()
        self.layers = ("Rotary", "ParallelLMHead") if tied_head else ("Rotary",)

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args
                    and any(layer in str(record.args[0]) for layer in self.layers))


def tensor_parallel_kwargs(size: int) -> dict:
    """``LLM`` arguments for an engine sharded over ``size`` worker processes (``rollout.tensor_parallel_size``).

    vLLM's external-launcher executor makes each calling process one tensor-parallel rank of the engine: it joins
    the torch process group the workers already share (FSDP's), and builds its tensor-parallel groups from
    consecutive ranks of that world (ranks r*T .. r*T+T-1; the world divided by T is "external" data parallel:
    independent engines). Every rank of an engine runs its own scheduler, so all of them must make the same calls
    with the same prompts, and sampling stays identical across them because they share the engine seed and
    all-reduced logits. vLLM's custom all-reduce is off: it needs every GPU visible to each process, and a Ray
    worker sees only its own; NCCL's all-reduce is used instead."""
    if size <= 1:
        return {}
    return {"tensor_parallel_size": size, "distributed_executor_backend": "external_launcher",
            "disable_custom_all_reduce": True}


class VLLMRolloutEngine:
    """RolloutEngine backed by an in-process ``vllm.LLM`` (see the module docstring)."""

    name = "vllm"

    def __init__(self, model_path: str, cfg: RolloutConfig, dtype: torch.dtype, device: str, max_model_len: int,
                 sleep_level: int = 1, lora_rank: int = 0):
        """Start the engine (seeded with ``cfg.seed``: per-request seeds crash vLLM on CPU when n > 1).

        ``sleep_level`` (GPU only): 1 keeps a CPU copy of the weights while asleep; 2 discards them (vLLM keeps
        the buffers, e.g. the rotary tables), which costs no host memory and no copies but requires a full
        ``update_weights`` between ``wake_up(["weights"])`` and the next rollout: until one arrives the engine
        refuses to generate.
        ``lora_rank`` > 0: the engine serves a LoRA adapter of that rank (``load_adapter``).
        """
        from vllm import LLM

        self.cfg = cfg
        self.device = device
        self.max_model_len = max_model_len
        self.on_cpu = not str(device).startswith("cuda")
        # vLLM on CPU has no sleep mode (its CPU worker ignores sleep/wake_up): the engine keeps weights and
        # KV cache in host memory for the whole run.
        self.supports_sleep = (not self.on_cpu) and cfg.free_cache_engine
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2, got {sleep_level!r}")
        self.sleep_level = sleep_level
        self._weights_discarded = False  # slept at level 2 and no update_weights since: the weights are garbage
        self._asleep: set = set()  # of SLEEP_PARTS: what sleep() released and wake_up() has not (asleep_parts)
        self._reload_open = False
        self._reload_names: set = set()  # HF names loaded in the open CPU reload session
        self._needs_cache_reset = False
        self._stale_prefix_cache = False  # a sync ended while requests ran: reset once none does
        self.prefix_cache_resets = 0  # prefix-cache resets done (tests observe the deferred one)
        self.last_sync: dict = {}
        kwargs = vllm_compat.engine_kwargs(
            model_path, dtype, cfg.seed, enforce_eager_for(cfg.enforce_eager, device), max_model_len, self.on_cpu,
            int(cfg.kv_cache_gb * GIB), cfg.gpu_memory_utilization, self.supports_sleep,
            max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            # weights that change between two engine steps need each step's tokens back before the next step runs
            async_scheduling=(vllm_compat.ASYNC_SCHEDULING_OFF if cfg.partial and cfg.partial_mode == "in_engine"
                              else None))
        kwargs.update(tensor_parallel_kwargs(cfg.tensor_parallel_size))
        kwargs.update(vllm_compat.lora_kwargs(lora_rank))
        self._lora = None  # the LoRARequest of the adapter every call uses (load_adapter), None: the base model
        self._lora_versions = 0
        self._lora_dir: Optional[str] = None
        set_num_threads = torch.set_num_threads
        self.llm = LLM(**kwargs)
        self.steps = count_steps(self.llm.llm_engine)
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op, for the OpenMP core binding its
        # multi-process executor does. In-process there is no binding, and the no-op would stop the actor
        # (same process) from ever choosing its thread count, so the real function is put back.
        torch.set_num_threads = set_num_threads
        if self.on_cpu and cfg.tensor_parallel_size > 1:
            self.llm.collective_rpc(vllm_compat.worker_unlink_cpu_shm)
        layerwise_log = logging.getLogger(LAYERWISE_LOGGER)
        if not any(isinstance(f, _ReloadNoiseFilter) for f in layerwise_log.filters):
            layerwise_log.addFilter(_ReloadNoiseFilter(ties_word_embeddings(model_path)))

    # ------------------------------------------------------------------ generation

    def generate(self, prompt_token_ids: List[List[int]], sampling: SamplingParams) -> List[List[Completion]]:
        """For each prompt, ``sampling.n`` completions (token ids, text, sampled-token log-probs, finish reason).
        The log-probs are vLLM's processed ones (``vllm_compat.PROCESSED_LOGPROBS``): of the distribution each token
        was sampled from, after temperature, top-k and top-p; for greedy samples, of the raw logits."""
        copies = self._check_prompts(prompt_token_ids, sampling)
        if not prompt_token_ids:
            return []
        requests = [vllm_compat.tokens_prompt(ids) for ids in prompt_token_ids for _ in range(copies)]
        outputs = self.llm.generate(requests, self._vllm_sampling(sampling, n=sampling.n // copies), use_tqdm=False,
                                    lora_request=self._lora)
        # vLLM runs without detokenising (its incremental detokeniser works per token inside the engine loop); the
        # texts are decoded here in one batched call of the fast tokenizer, once each sample is complete.
        samples = [c for out in outputs for c in out.outputs]
        texts = iter(self.llm.get_tokenizer().batch_decode([c.token_ids for c in samples], skip_special_tokens=True))
        completions = [[self._completion(c, next(texts)) for c in out.outputs] for out in outputs]
        return [sum(completions[i * copies:(i + 1) * copies], []) for i in range(len(prompt_token_ids))]

    def generate_steps(self, prompt_token_ids: List[List[int]], sampling: SamplingParams,
                       before_step: Callable[[], int]) -> list:
        """``generate``'s completions (same sampling, same fields), as ``partial.VersionedCompletion``s, generated one
        engine step at a time (``vllm_stepper``): ``before_step()`` runs before every step, may load new weights
        (the requests stay in the engine with their KV cache) and returns the version that stamps the step's
        tokens. A sync that ends mid-flight cannot drop the prefix cache; the next call does, before its requests."""
        copies = self._check_prompts(prompt_token_ids, sampling)
        if not prompt_token_ids:
            return []
        prompts = [ids for ids in prompt_token_ids for _ in range(copies)]
        groups = vllm_stepper.run(self.llm, prompts, self._vllm_sampling(sampling, n=sampling.n // copies),
                                  self._lora, before_step)
        return self._versioned(groups, len(prompt_token_ids), sampling)

    def generate_joined(self, prompt_token_ids: List[List[int]], sampling: SamplingParams, loop) -> list:
        """``generate_steps``' completions, the requests added to ``loop`` (a ``step_loop.StepLoop`` of this engine,
        run on the engine's thread): called from another thread, this call joins the loop's running requests
        between two of its steps, or starts the loop. The engine is readied by the loop (``ready_for_use``), which
        runs before it adds requests to an engine with none running."""
        copies = self._check_prompts(prompt_token_ids, sampling, ready=False)
        if not prompt_token_ids:
            return []
        prompts = [ids for ids in prompt_token_ids for _ in range(copies)]
        waiting = loop.submit(prompts, self._vllm_sampling(sampling, n=sampling.n // copies), self._lora)
        groups = loop.wait(waiting)
        return self._versioned(groups, len(prompt_token_ids), sampling, joined=waiting.joined)

    def _versioned(self, groups, prompts: int, sampling: SamplingParams, joined: bool = False) -> list:
        """The stepper's Streams as ``partial.VersionedCompletion``s, ``sampling.n`` per prompt, texts decoded;
        ``joined``: the call's requests joined running ones (``VersionedCompletion.joined``)."""
        from reasonrl.rollout.partial import VersionedCompletion

        samples = [s for group in groups for s in group]
        texts = self.llm.get_tokenizer().batch_decode([s.token_ids for s in samples], skip_special_tokens=True)
        done = [VersionedCompletion(s.token_ids, t, s.logprobs, s.finish_reason, s.versions, joined)
                for s, t in zip(samples, texts)]
        per = sampling.n
        return [done[i * per:(i + 1) * per] for i in range(prompts)]

    def _check_prompts(self, prompt_token_ids: List[List[int]], sampling: SamplingParams, ready: bool = True) -> int:
        """Ready the engine (unless not ``ready``), refuse empty or too long prompts; the requests per prompt
        (``copies``): vLLM refuses n > 1 at temperature 0, and greedy samples are all alike, so a greedy prompt is
        asked n times for one."""
        if ready:
            self.ready_for_use()
        for i, ids in enumerate(prompt_token_ids):
            if len(ids) == 0:
                raise ValueError(f"prompt {i} is empty")
            if len(ids) >= self.max_model_len:
                raise ValueError(f"prompt {i} has {len(ids)} tokens; max_model_len is {self.max_model_len}")
        return sampling.n if sampling.temperature <= 0 and sampling.n > 1 else 1

    def _vllm_sampling(self, sampling: SamplingParams, n: int):
        # sampling.seed is not passed on: a per-request seed with n > 1 crashes vLLM on CPU; the engine is
        # seeded once at start-up (cfg.seed) instead.
        return vllm_compat.sampling_params(n, sampling.temperature, sampling.top_p, sampling.top_k,
                                           sampling.max_new_tokens, sampling.stop_token_ids, sampling.ignore_eos,
                                           bool(sampling.logprobs), sampling.stop)

    @staticmethod
    def _completion(out, text: str) -> Completion:
        token_ids = out.token_ids if type(out.token_ids) is list else list(out.token_ids)
        logprobs = vllm_compat.sampled_logprobs(out)
        return Completion(token_ids=token_ids, text=text, logprobs=logprobs,
                          finish_reason=vllm_stepper.finish_reason(out.finish_reason))

    def sequence_logprobs(self, prompts: List[List[int]], responses: List[List[int]]) -> List[List[float]]:
        """Log-probabilities (temperature 1) of each response token given its prompt under the engine's
        current weights, from vLLM's prompt log-probs of prompt + response (same signature as the hf
        engine's); the engine side of ``weight_sync.sequence_logprobs_check``."""
        self.ready_for_use()
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty: the first token has no log-prob")
        wanted = [i for i, r in enumerate(responses) if r]
        outs = self.llm.generate([vllm_compat.tokens_prompt(list(prompts[i]) + list(responses[i])) for i in wanted],
                                 vllm_compat.prompt_logprob_params(), use_tqdm=False,
                                 lora_request=self._lora) if wanted else []
        result: List[List[float]] = [[] for _ in prompts]
        for i, out in zip(wanted, outs):
            result[i] = vllm_compat.prompt_logprobs_of(out, len(prompts[i]), responses[i])
        return result

    # ------------------------------------------------------------------ weight sync

    def update_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Load new weights: (Hugging Face name, full tensor) pairs, possibly one bucket per call. Names may
        carry wrapper prefixes (FSDP1, torch.compile, checkpointing); sharded DTensors are gathered."""
        weights = []
        for name, tensor in named_tensors:
            if hasattr(tensor, "full_tensor"):  # a DTensor shard: gather the full parameter
                tensor = tensor.full_tensor()
            weights.append((normalize_param_name(name), tensor.detach()))
        if not weights:
            return
        if "weights" in self._asleep:
            raise RuntimeError("update_weights while the weights are asleep: call wake_up(['weights']) first")
        self._weights_discarded = False
        if self.on_cpu:
            names = {name for name, _ in weights}
            if len(names) < len(weights):
                raise ValueError("update_weights got the same parameter twice in one call")
            if self._reload_open and names & self._reload_names:
                self.finish_weight_update()  # a name seen again starts the next sync: close this one
            if not self._reload_open:
                self.llm.collective_rpc(vllm_compat.worker_reload_begin)
                self._reload_open, self._reload_names = True, set()
                self.last_sync = {"tensors": 0, "bytes": 0, "buckets": 0}
            self._reload_names |= names
            self.llm.collective_rpc(vllm_compat.worker_reload_bucket, args=(weights,))
        else:
            if not self._needs_cache_reset:
                self.last_sync = {"tensors": 0, "bytes": 0, "buckets": 0}
            self.llm.collective_rpc(vllm_compat.worker_load_direct, args=(weights,))
        self._needs_cache_reset = True
        self.last_sync["tensors"] += len(weights)
        self.last_sync["bytes"] += sum(tensor_nbytes(t) for _, t in weights)
        self.last_sync["buckets"] += 1

    def load_adapter(self, named_tensors: Iterable[Tuple[str, torch.Tensor]], adapter_config: dict) -> None:
        """Serve a new version of the LoRA adapter (PEFT's saved names, full tensors; ``adapter_config``: its
        ``adapter_config.json``): saved as a PEFT directory and used from the next call on through a
        ``LoRARequest`` with a new id (vLLM caches adapters by id). Needs an engine started with ``lora_rank``."""
        import shutil
        import tempfile

        from reasonrl.models.lora import save_adapter_dir

        if "weights" in self._asleep:
            raise RuntimeError("load_adapter while the weights are asleep: call wake_up(['weights']) first")
        self._lora_versions += 1
        directory = tempfile.mkdtemp(prefix=f"reasonrl_lora_v{self._lora_versions}_")
        save_adapter_dir(directory, {n: t.float() for n, t in named_tensors}, adapter_config)
        old, self._lora_dir = self._lora_dir, directory
        self._lora = vllm_compat.lora_request(f"reasonrl_v{self._lora_versions}", self._lora_versions, directory)
        self._stale_prefix_cache = True  # cached KV was computed under the old adapter
        self._reset_stale_prefix_cache()
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def finish_weight_update(self) -> None:
        """End a sync: finish the CPU reload session and drop KV blocks cached under the old weights.
        Called by ``generate``/``sequence_logprobs`` when a sync is pending, and by ``update_weights`` when a
        parameter arrives a second time (the next sync has begun); calling it twice is harmless. Raises
        (after closing the session, the engine still usable) if a fused layer got only some of its parts
        (e.g. q and k but no v): such a layer keeps its old weights."""
        incomplete: List[str] = []
        if self._reload_open:
            incomplete = self.llm.collective_rpc(vllm_compat.worker_reload_finish)[0]
            self._reload_open, self._reload_names = False, set()
        if self._needs_cache_reset:
            self._stale_prefix_cache = True  # prefix-cached KV was computed with the old weights
            self._needs_cache_reset = False
        self._reset_stale_prefix_cache()
        if incomplete:
            raise RuntimeError("weight sync incomplete: these fused layers got only some of their parts and kept "
                               "their old weights: " + ", ".join(incomplete[:10])
                               + (" ..." if len(incomplete) > 10 else ""))

    def _reset_stale_prefix_cache(self) -> None:
        """Drop the prefix cache if a sync made it stale, unless requests are running (``generate_steps`` loading
        weights between two steps): vLLM cannot drop blocks in use, so the reset waits for the next call."""
        if self._stale_prefix_cache and not self.llm.llm_engine.has_unfinished_requests():
            if self.llm.reset_prefix_cache() is not False:  # 0.26.0 and 0.32.0 return whether it was done
                self._stale_prefix_cache = False
                self.prefix_cache_resets += 1

    def ready_for_use(self) -> None:
        """Refuse an engine asleep or without weights; finish a pending sync (the prefix cache dropped if stale and
        no request runs). ``step_loop.StepLoop`` calls it before adding requests to an engine with none running."""
        if self._asleep:
            raise RuntimeError(f"the vLLM engine is asleep ({sorted(self._asleep)}): call wake_up() first")
        if self._weights_discarded:
            raise RuntimeError("the vLLM engine slept at level 2 (rollout.sleep_level), which discards its weights, "
                               "and no weight sync has refilled them since: sync the weights before generating")
        self.finish_weight_update()

    # ------------------------------------------------------------------ memory phases

    @property
    def asleep_parts(self) -> FrozenSet[str]:
        """What ``sleep`` freed and ``wake_up`` has not restored (always empty on CPU)."""
        return frozenset(self._asleep)

    def sleep(self) -> None:
        """GPU: free the KV cache and offload (level 1) or discard (level 2) the weights while the actor
        trains. CPU: no-op, vLLM has no sleep mode on CPU and keeps its memory."""
        if not self.supports_sleep:
            return
        self.finish_weight_update()
        self.llm.sleep(level=self.sleep_level)
        self._asleep = set(SLEEP_PARTS)
        self._weights_discarded = self.sleep_level == 2

    def wake_up(self, tags: Optional[List[str]] = None) -> None:
        """GPU: re-allocate what ``sleep`` freed; ``tags=["weights"]`` then ``["kv_cache"]`` lets the caller
        sync weights before the KV cache takes its memory (None: both). CPU: no-op."""
        if not self.supports_sleep:
            return
        vllm_compat.wake_up(self.llm, tags)
        self._asleep -= set(tags) if tags is not None else set(SLEEP_PARTS)
        if not self._asleep:
            self.llm.reset_prefix_cache()

    def shutdown(self) -> None:
        """Release the engine (tests and benchmarks that start another one in the same process)."""
        if getattr(self, "_lora_dir", None):
            import shutil

            shutil.rmtree(self._lora_dir, ignore_errors=True)
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            vllm_compat.shutdown(llm)
            del llm
