"""``python -m reasonrl.eval key=value ...`` (also the ``reasonrl-eval`` script): same config system as training."""
from __future__ import annotations

import logging
import sys
from typing import Callable, List, Optional

SAMPLING_TEMPERATURE = 1.0
"""Temperature used when eval.n > 1 and the user did not set eval.temperature (the default 0 is greedy)."""

USAGE = """usage: python -m reasonrl.eval task=gsm8k model.path=PATH [key=value ...]

Samples eval.n responses per problem, verifies them and reports pass@k, maj@k and mean accuracy.
Common keys: eval.n, eval.k=[1,4,16], eval.limit (first N problems), eval.output_dir, eval.temperature,
eval.max_new_tokens, eval.batch_size, eval.split (val|train), rollout.engine (auto|vllm|hf).
rollout.n/temperature/top_p/max_new_tokens=V are taken as eval.<same>=V unless that eval key is given.
See docs/evaluation.md."""


ROLLOUT_TO_EVAL = {"rollout.n": "eval.n", "rollout.temperature": "eval.temperature", "rollout.top_p": "eval.top_p",
                   "rollout.max_new_tokens": "eval.max_new_tokens"}
"""Training's sampling keys that evaluation takes as its own when given on the command line."""
ROLLOUT_IGNORED = {"rollout.top_k": "evaluation samples without top-k",
                   "rollout.val_temperature": "set eval.temperature"}
"""Training's sampling keys with no evaluation counterpart, and what to do instead."""


def _given_keys(argv: List[str]) -> set:
    return {arg.split("=", 1)[0].strip().lstrip("+") for arg in argv if "=" in arg}


def map_rollout_overrides(argv: List[str], warn: Callable[[str], None]) -> List[str]:
    """Evaluation samples with ``eval.*``: a ``rollout.n/temperature/top_p/max_new_tokens=V`` argument becomes
    ``eval.<same>=V`` unless that eval key is given too (then the rollout one is ignored); other rollout sampling
    keys are ignored. Each case is reported through ``warn``, never silently."""
    given = _given_keys(argv)
    out = list(argv)
    for arg in argv:
        key, _, value = arg.partition("=")
        key = key.strip().lstrip("+")
        if key in ROLLOUT_TO_EVAL and ROLLOUT_TO_EVAL[key] in given:
            warn(f"warning: {key}={value} is ignored: evaluation samples with {ROLLOUT_TO_EVAL[key]}, also given")
        elif key in ROLLOUT_TO_EVAL:
            warn(f"note: {key}={value} is taken as {ROLLOUT_TO_EVAL[key]}={value} (evaluation samples with eval.*)")
            out.append(f"{ROLLOUT_TO_EVAL[key]}={value}")
        elif key in ROLLOUT_IGNORED:
            warn(f"warning: {key}={value} is ignored by evaluation ({ROLLOUT_IGNORED[key]})")
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """Run an evaluation from ``key=value`` arguments; returns the exit status (0 ok, 2 bad input, 130 interrupt)."""
    from reasonrl.config import ConfigError, load_config
    from reasonrl.datasets import DataError
    from reasonrl.models.loader import ModelNotFoundError

    from .report import format_table
    from .runner import EvalError, run_eval
    from .store import EvalStoreError

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help", "help") for a in argv):
        print(USAGE)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        argv = map_rollout_overrides(argv, lambda line: print(line, file=sys.stderr))
        cfg, _notes = load_config(argv)
        if cfg.eval.n > 1 and cfg.eval.temperature <= 0 and "eval.temperature" not in _given_keys(argv):
            print(f"note: eval.n={cfg.eval.n} samples need sampling; using eval.temperature={SAMPLING_TEMPERATURE} "
                  f"(set eval.temperature= to choose)")
            cfg.eval.temperature = SAMPLING_TEMPERATURE
        summary = run_eval(cfg)
    except (ConfigError, DataError, EvalError, EvalStoreError, ModelNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(format_table(summary))
    print(f"wrote {cfg.eval.output_dir}/summary.json and {summary['samples_parquet']}")
    return 0
