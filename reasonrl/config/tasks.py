"""The task registry: every fact about a built-in task, in one place.

A task is a dataset recipe plus how its responses are asked for, how long they may be and which verifier scores
them. The rest of the code reads this table: ``task=NAME`` presets (``reasonrl.config.presets``), the data files
(``reasonrl.datasets.task_files``), the data_source -> verifier fallback (``reasonrl.rewards``), the docs.

The registry only supplies defaults. Which verifier scores a row is the row's own choice (its ``verifier`` column,
else its ``data_source`` looked up here), unless the user forces one with ``reward.verifier=``; so a training file
that mixes tasks is scored row by row (docs/tasks.md).

Plain data, no imports beyond the standard library: config is read by every layer, verifier processes included.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Task:
    """One built-in task."""

    name: str
    """What ``task=`` takes."""
    recipe: str
    """The recipe module under ``reasonrl.datasets`` that writes its parquet."""
    train_split: str
    """The recipe's split trained on."""
    val_split: str
    """The recipe's split validated (and by default evaluated) on."""
    verifier: str
    """The registered verifier that scores its rows (the default: a row's ``verifier`` column wins)."""
    data_sources: Tuple[str, ...]
    """``data_source`` values that mean this task, for rows without a ``verifier`` column (verl-style data)."""
    prompt_format: str
    """What the prompt asks the response to end with (the recipe writes the instruction; the verifier reads it)."""
    max_new_tokens: int
    """Generation length of the task preset (``rollout.max_new_tokens``)."""
    verify_timeout_s: Optional[float] = None
    """``reward.timeout_s`` of the task preset (None: the schema default); code and proofs need longer."""
    tool_turns: int = 0
    """Model turns of a tool-using task (``rollout.max_turns``; the preset turns ``tool.enabled`` on); 0: no tool."""
    environment: str = ""
    """The environment its rows name (docs/environments.md); the preset makes it ``env.default`` too, so a prompt
    whose row the loop cannot look up still runs in it. "": the tool's (``tool.name``)."""
    prompt_tokens: int = 0
    """``data.max_prompt_length`` its prompts need when that is more than the CPU profile's 384 (its longest prompt,
    chat template applied); the preset sets it and the profile does not cut it. 0: the default and the profile's."""


TASKS: Dict[str, Task] = {t.name: t for t in (
    # Grade-school math: numeric answers after '####' in the gold.
    Task("gsm8k", "gsm8k", "train", "test", "math", ("openai/gsm8k", "gsm8k"),
         "reasoning, then the final answer in \\boxed{}", 512),
    # MATH: LaTeX answers; trains on MATH train, validates on MATH-500.
    Task("math", "math", "train", "test", "math",
         ("math", "hendrycks_math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval"),
         "reasoning, then the final answer in \\boxed{}", 1024),
    # MATH-500 alone (train and validate on it: for evaluation, `python -m reasonrl.eval task=math500`).
    Task("math500", "math", "test", "test", "math", ("math500", "HuggingFaceH4/MATH-500"),
         "reasoning, then the final answer in \\boxed{}", 1024),
    # Generated two-number arithmetic: small, fast, partly solvable by tiny models.
    Task("arith", "arith", "train", "test", "math", ("arith",), "the answer in \\boxed{}", 64),
    # arith with difficulty levels (easy / medium / hard, each its data_source) for the curriculum experiments.
    Task("arith_levels", "arith_levels", "train", "test", "math", ("arith_easy", "arith_medium", "arith_hard"),
         "the answer in \\boxed{}", 64),
    # Chained + and - of 2-digit numbers at five levels (3, 4, 5, 6, 8 operands; l1 .. l5, each its data_source): the
    # same skill at every level, longer chains (docs/tasks.md). 256 tokens leave room to work a chain out.
    Task("arith_chain", "arith_chain", "train", "test", "math", tuple(f"arith_chain_l{i}" for i in range(1, 6)),
         "the answer in \\boxed{}", 256),
    # Countdown puzzles at five levels (l1 .. l5, each its data_source): reach a target from given numbers with + - * /,
    # each number at most once; scored exactly by the countdown verifier (docs/tasks.md).
    Task("countdown", "countdown", "train", "test", "countdown", tuple(f"countdown_l{i}" for i in range(1, 6)),
         "an expression over the given numbers in \\boxed{}", 256),
    # Code: the response's ```python block runs against the row's tests in a sandbox.
    Task("mbpp", "mbpp", "train", "test", "code", ("mbpp",), "a ```python code block", 512, 30.0),
    Task("humaneval", "humaneval", "test", "test", "code", ("humaneval", "openai_humaneval"),
         "a ```python code block", 512, 30.0),
    # GSM8K + MATH with a Python tool: the model runs code in the sandbox while it solves (docs/tools.md).
    Task("math_tool", "math_tool", "train", "test", "math", (),
         "reasoning with ```python cells run by the tool, then the final answer in \\boxed{}", 1024, tool_turns=4),
    # Generated questions about a fictional corpus, answered with the search environment's tool (docs/environments.md).
    Task("search", "search", "train", "test", "math", ("search",),
         "<tool_call> searches of the corpus, then the year in \\boxed{}", 384, tool_turns=4,
         environment="search"),
    # search's questions after one worked example of the call in chat turns (datasets/search_example.py).
    Task("search_example", "search_example", "train", "test", "math", (),
         "<tool_call> searches of the corpus (one worked example shown), then the year in \\boxed{}", 384,
         tool_turns=4, environment="search"),
    # the same with two worked examples (a person, a city; datasets/search_examples.py's SHOWN).
    Task("search_examples", "search_examples", "train", "test", "math", (),
         "<tool_call> searches of the corpus (two worked examples shown), then the year in \\boxed{}", 384,
         tool_turns=4, environment="search", prompt_tokens=448),
    # the same with all three worked examples, the third a two-hop question with two calls (datasets/search_hops.py).
    Task("search_hops", "search_hops", "train", "test", "math", (),
         "<tool_call> searches of the corpus (three worked examples shown, one of two calls), then the year in "
         "\\boxed{}", 384, tool_turns=4, environment="search", prompt_tokens=656),
    # MBPP in turns: the code_feedback environment runs each submission's tests and shows the failures.
    Task("code_feedback", "code_feedback", "train", "test", "code", ("code_feedback",),
         "```python submissions, fixed from the test failures shown", 768, 30.0, tool_turns=3,
         environment="code_feedback"),
    # Lean 4 proofs (needs a Lean REPL).
    Task("minif2f", "minif2f", "valid", "test", "lean", ("minif2f",), "the whole theorem in a ```lean4 block",
         1024, 120.0),
)}


def get_task(name: str) -> Task:
    """The registered task ``name``; a KeyError that lists the known ones otherwise."""
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
    return TASKS[name]


DATA_SOURCE_VERIFIERS: Dict[str, str] = {source: t.verifier for t in TASKS.values() for source in t.data_sources}
"""data_source -> verifier, derived from the table above."""


def verifier_for_data_source(source: str) -> Optional[str]:
    """The verifier of the task that ``source`` belongs to (None: no task claims it)."""
    return DATA_SOURCE_VERIFIERS.get(source)


def task_preset(name: str) -> Dict[str, Dict[str, object]]:
    """The config values ``task=name`` sets (beneath algorithm presets, the size profile and the user's keys).
    It sets no ``reward.verifier``: rows choose their own verifier."""
    task = get_task(name)
    preset: Dict[str, Dict[str, object]] = {"rollout": {"max_new_tokens": task.max_new_tokens}}
    if task.verify_timeout_s is not None:
        preset["reward"] = {"timeout_s": task.verify_timeout_s}
    if task.tool_turns:
        preset["rollout"]["max_turns"] = task.tool_turns
        preset["tool"] = {"enabled": True}
    if task.environment:
        preset["env"] = {"default": task.environment}
    if task.prompt_tokens:
        preset["data"] = {"max_prompt_length": task.prompt_tokens}
    return preset
