"""Shared by the environment tests: a scripted policy that plays the model's turns (the environments, the sandbox
and the real SmolLM2 tokenizer stay real), and a chat prompt of the real template."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from reasonrl.rollout.base import Completion


class ScriptedPolicy:
    """An engine whose turns are scripted per prompt (keyed by the prompt's token ids): each generate call on a
    context that starts with the prompt returns its next turn, tokenized canonically, cut after the first stop
    string as the engines cut it, with EOS after a turn when ``eos`` says so (hermes turns end with EOS). A turn given
    as a list of token ids is returned as those tokens (a sampled, possibly non-canonical split), EOS after it."""

    def __init__(self, tokenizer, scripts: Dict[Tuple[int, ...], Sequence[str]], eos: bool = True) -> None:
        self.tokenizer, self.scripts, self.eos = tokenizer, scripts, eos
        self.served = {key: 0 for key in scripts}
        self.calls: List[Tuple[int, List[str]]] = []  # (contexts, stop strings) per call

    def generate(self, prompts, sampling):
        self.calls.append((len(prompts), list(sampling.stop)))
        out = []
        for context in prompts:
            key = next(k for k in self.scripts if tuple(context[:len(k)]) == k)
            turns, i = self.scripts[key], self.served[key]
            self.served[key] += 1
            text = turns[min(i, len(turns) - 1)]
            if isinstance(text, list):
                ids = list(text) + ([self.tokenizer.eos_token_id] if self.eos else [])
                out.append([Completion(ids, self.tokenizer.decode(ids), [-0.5] * len(ids), "stop")] * sampling.n)
                continue
            cut = min([text.find(s) + len(s) for s in sampling.stop if s in text] or [len(text)])
            ids = self.tokenizer.encode(text[:cut], add_special_tokens=False)
            stopped = cut < len(text)
            if self.eos and not stopped:
                ids.append(self.tokenizer.eos_token_id)
            ids = ids[:sampling.max_new_tokens]
            out.append([Completion(ids, text[:cut], [-0.5] * len(ids), "stop") for _ in range(sampling.n)])
        return out


def chat_prompt(tokenizer, question: str, system: str = "") -> List[int]:
    """The prompt's token ids as the trainer renders them (chat template, generation prompt)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if not isinstance(ids, list) else ids)


def tool_runs(tokenizer, completion) -> List[str]:
    """The decoded text of each tool turn of a trajectory."""
    runs, run = [], []
    for tok, m in zip(list(completion.token_ids) + [None], list(completion.tool_mask) + [0]):
        if m:
            run.append(tok)
        elif run:
            runs.append(tokenizer.decode(run))
            run = []
    return runs
