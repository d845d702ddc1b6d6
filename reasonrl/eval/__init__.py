"""Offline evaluation: pass@k, maj@k and mean accuracy of any model on any task (``python -m reasonrl.eval``)."""
from .cli import main
from .metrics import ProblemOutcome, maj_at_k, majority_vote, metric_block, pass_at_k, summarize

__all__ = ["ProblemOutcome", "main", "maj_at_k", "majority_vote", "metric_block", "pass_at_k", "run_eval",
           "summarize"]


def run_eval(cfg, echo=print):
    """Evaluate ``cfg.model.path`` on ``cfg.task`` (see ``reasonrl.eval.runner.run_eval``)."""
    from .runner import run_eval as _run_eval

    return _run_eval(cfg, echo)
