"""What the console shows while a run waits: the training bar, whose postfix names the phase running, with a line as
each phase starts and ends on the first step of a process (the slow one: the engine's first batch, compilation,
the verifiers' start); the validation bar, counting prompts; timed lines around a start-up wait."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Optional

from tqdm import tqdm


class StepProgress:
    """The bar of ``trainer.total_steps``, one tick per step; ``phase`` is a ``PhaseTimer``'s ``on_phase``."""

    NOT_SHOWN = ("step",)  # the whole step: the bar itself

    def __init__(self, total: int, initial: int) -> None:
        self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)
        self.first = True  # the first step of this process: a line per phase

    def phase(self, name: str, seconds: Optional[float]) -> None:
        """Phase ``name`` started (``seconds`` None) or ended after ``seconds``."""
        if name in self.NOT_SHOWN:
            return
        self.bar.set_postfix_str(name if seconds is None else f"{name} done", refresh=True)
        if self.first:
            step = self.bar.n + 1
            tqdm.write(f"step {step}: {name} ..." if seconds is None
                       else f"step {step}: {name} done in {seconds:.1f} s")

    def step_done(self) -> None:
        self.first = False
        self.bar.set_postfix_str("")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


@contextmanager
def timed(what: str, done: str = "done") -> Iterator[None]:
    """``reasonrl: <what> ...`` now and ``reasonrl: <what>: <done> in N s`` after, for a wait of unknown length."""
    print(f"reasonrl: {what} ...", flush=True)
    start = time.perf_counter()
    yield
    print(f"reasonrl: {what}: {done} in {time.perf_counter() - start:.1f} s", flush=True)


def validation_bar(prompts: int) -> tqdm:
    """The bar of a validation pass, in prompts (its postfix: the accuracy so far)."""
    return tqdm(total=prompts, desc="validate", unit="prompt", dynamic_ncols=True)
