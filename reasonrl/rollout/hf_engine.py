"""The hf engine: transformers ``generate`` on a full (unsharded) copy of the policy — the fallback that runs anywhere.

It keeps its own copy of the weights, like vLLM does, so rollout never runs through FSDP collectives (ranks may
generate different lengths), and new weights arrive through the same ``update_weights`` path as vLLM's.

Sampled-token log-probs come from a second, teacher-forced pass over prompt + response at the sampling temperature
(greedy: 1), the formula the trainer uses (``reasonrl.models.forward``): log_softmax(logits / T). Top-k and top-p
are not applied to them (vLLM's processed log-probs include their renormalisation; with the defaults, top_p=1 and
top_k=-1, the two engines report the same distribution).
"""
from __future__ import annotations

from typing import FrozenSet, Iterable, List, Optional, Tuple

import torch

from .base import Completion, SamplingParams, StepCounter


def _window(stops: List[str]) -> int:
    """Tokens that surely hold a stop string that the last of them completed (a token holds at least one char)."""
    return max(len(s) for s in stops) + 2


def first_stop_string_end(tokenizer, token_ids: List[int], stops: List[str]):
    """The length of the shortest prefix of ``token_ids`` whose decoded text contains a stop string (None: none)."""
    if not any(s in tokenizer.decode(token_ids, skip_special_tokens=True) for s in stops):
        return None
    w = _window(stops)
    for j in range(len(token_ids)):
        tail = tokenizer.decode(token_ids[max(0, j + 1 - w):j + 1], skip_special_tokens=True)
        if any(s in tail for s in stops):
            return j + 1
    return None


class StopStrings:
    """A transformers stopping criterion: a row is done once its last generated tokens contain a stop string."""

    def __init__(self, tokenizer, stops: List[str], prompt_width: int) -> None:
        self.tokenizer, self.stops, self.prompt_width = tokenizer, list(stops), prompt_width
        self.window = _window(stops)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        tails = input_ids[:, self.prompt_width:][:, -self.window:].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stops) for t in texts], dtype=torch.bool,
                            device=input_ids.device)


class CountTokens:
    """A stopping criterion that never stops: it counts ``generate``'s decode steps into ``counter``."""

    def __init__(self, counter: StepCounter) -> None:
        self.counter = counter

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.counter.count += 1
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class HFRolloutEngine:
    name = "hf"
    supports_sleep = False

    def __init__(self, model, tokenizer, device: str = "cpu", logprob_micro_batch: int = 16) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.logprob_micro_batch = logprob_micro_batch
        self._params = dict(self.model.named_parameters())
        self.steps = StepCounter()

    @classmethod
    def from_pretrained(cls, path: str, tokenizer, dtype: torch.dtype, device: str) -> "HFRolloutEngine":
        from reasonrl.models import load_causal_lm

        return cls(load_causal_lm(path, dtype), tokenizer, device)

    @torch.no_grad()
    def generate(self, prompt_token_ids: List[List[int]], sampling: SamplingParams) -> List[List[Completion]]:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        pad = self.tokenizer.pad_token_id
        eos = self.tokenizer.eos_token_id
        stop_ids = ([] if sampling.ignore_eos else [eos]) + list(sampling.stop_token_ids)
        width = max(len(p) for p in prompt_token_ids)
        input_ids = torch.full((len(prompt_token_ids), width), pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for i, p in enumerate(prompt_token_ids):  # left padding
            input_ids[i, width - len(p):] = torch.tensor(p)
            attention[i, width - len(p):] = 1
        greedy = sampling.temperature <= 0
        kwargs = dict(do_sample=not greedy, max_new_tokens=sampling.max_new_tokens,
                      num_return_sequences=1 if greedy else sampling.n, pad_token_id=pad,
                      eos_token_id=stop_ids or None, return_dict_in_generate=False)
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k if sampling.top_k > 0 else None)
        if sampling.ignore_eos:
            kwargs.update(min_new_tokens=sampling.max_new_tokens)
        from transformers import StoppingCriteriaList

        criteria = [CountTokens(self.steps)] + ([StopStrings(self.tokenizer, sampling.stop, width)] if sampling.stop
                                                else [])
        kwargs.update(stopping_criteria=StoppingCriteriaList(criteria))
        out = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                                  **kwargs).cpu()
        if greedy and sampling.n > 1:  # greedy samples are identical: decode once (transformers refuses n > 1)
            out = out.repeat_interleave(sampling.n, dim=0)
        gen = out[:, width:]
        prompts = [p for p in prompt_token_ids for _ in range(sampling.n)]
        token_lists, reasons = [], []
        for row in gen.tolist():
            cut, reason = len(row), "length"
            for j, tok in enumerate(row):
                if tok in stop_ids:
                    cut, reason = j + 1, "stop"
                    break
            if sampling.stop:
                at = first_stop_string_end(self.tokenizer, row[:cut], sampling.stop)
                if at is not None:
                    cut, reason = at, "stop"
            token_lists.append(row[:cut])
            reasons.append(reason)
        scoring_temperature = sampling.temperature if sampling.temperature > 0 else 1.0  # greedy: the model's own
        logprobs = (self.sequence_logprobs(prompts, token_lists, scoring_temperature) if sampling.logprobs
                    else [[] for _ in token_lists])
        completions = [Completion(t, self.tokenizer.decode(t, skip_special_tokens=True), lp, r)
                       for t, lp, r in zip(token_lists, logprobs, reasons)]
        return [completions[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompt_token_ids))]

    @torch.no_grad()
    def sequence_logprobs(self, prompts: List[List[int]], responses: List[List[int]],
                          temperature: float = 1.0) -> List[List[float]]:
        """Log-probabilities of each response token given its prompt, by one teacher-forced pass, under
        softmax(logits / ``temperature``) (> 0; the protocol's call leaves it at 1; ``generate`` passes the
        sampling temperature)."""
        from reasonrl.algorithms.logprob import log_probs_from_logits

        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        result: List[List[float]] = []
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(prompts), self.logprob_micro_batch):
            ps, rs = prompts[start:start + self.logprob_micro_batch], responses[start:start + self.logprob_micro_batch]
            pw, rw = max(len(p) for p in ps), max(max(len(r) for r in rs), 1)
            ids = torch.full((len(ps), pw + rw), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, (p, r) in enumerate(zip(ps, rs)):
                ids[i, pw - len(p):pw + len(r)] = torch.tensor(p + r)
                mask[i, pw - len(p):pw + len(r)] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                position_ids=pos.to(self.device)).logits[:, pw - 1:-1].float()
            if temperature != 1.0:
                logits = logits / temperature
            lp = log_probs_from_logits(logits, ids[:, pw:].to(self.device)).cpu()
            result.extend(lp[i, :len(r)].tolist() for i, r in enumerate(rs))
            self.steps.count += 1  # a micro-batch scored is engine work done too (the fleet's heartbeat)
        return result

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            if name not in self._params:
                raise KeyError(f"hf engine: unknown parameter {name!r}")
            self._params[name].copy_(tensor.to(self._params[name].dtype))

    @torch.no_grad()
    def load_adapter(self, named_tensors: Iterable[Tuple[str, torch.Tensor]], adapter_config: dict) -> None:
        """Apply a new version of the LoRA adapter (PEFT's saved names; ``adapter_config``: its
        ``adapter_config.json``) to this engine's copy of the base model: the first call wraps the model with peft,
        every call loads the tensors (peft's ``set_peft_model_state_dict``). A tensor the adapter does not have, or
        an adapter tensor left out, is an error naming it."""
        from peft import get_peft_config, get_peft_model, set_peft_model_state_dict

        if not hasattr(self.model, "peft_config"):
            config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in adapter_config.items()}
            self.model = get_peft_model(self.model, get_peft_config(config)).eval()
        state = {name: tensor for name, tensor in named_tensors}
        result = set_peft_model_state_dict(self.model, state)
        missing = [k for k in result.missing_keys if ".lora_" in k]
        if result.unexpected_keys or missing:
            raise KeyError(f"hf engine: adapter tensors that do not fit: unexpected {result.unexpected_keys[:5]}, "
                           f"missing {missing[:5]}")

    def finish_weight_update(self) -> None:
        """Nothing to finish: ``update_weights`` copies straight into the live parameters."""

    asleep_parts: FrozenSet[str] = frozenset()
    """Never asleep (see ``sleep``)."""

    def sleep(self) -> None:
        """No-op: the hf engine keeps its weights (it has no KV cache between calls)."""

    def wake_up(self, tags: Optional[List[str]] = None) -> None:
        """No-op (see ``sleep``)."""

    def shutdown(self) -> None:
        """Drop the model copy (its memory is freed once nothing else holds it)."""
        self.model, self._params = None, {}
