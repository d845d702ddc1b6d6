"""Curriculum samplers (``data.sampler``) and their metrics; the statistics they read are in ``prompt_stats.py``.

Every sampler has the interface of ``EpochSampler`` that the trainer uses: ``next_indices() -> List[int]`` (one
batch of dataset positions), ``epoch``, ``offset``, ``state_dict()`` (JSON-friendly) and ``load_state_dict()``, plus
``last_indices`` (the batch drawn last). A draw depends only on the seed, the number of draws so far and (for
``pass_rate``) the prompt statistics, never on a process-global RNG: after ``load_state_dict`` of the sampler and of
its ``PromptStats`` the same batches come out as without the interruption.
"""
from __future__ import annotations

import logging
import math
import random
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from reasonrl.datasets import DataError

from .prompt_stats import PromptStats, pass_rate_band
from .prompts import EpochSampler

log = logging.getLogger(__name__)

SAMPLERS = ("uniform", "pass_rate", "mixture")
"""The values of ``data.sampler``."""


def _check_kind(state: Mapping[str, Any], kind: str) -> None:
    """A checkpoint written with another ``data.sampler`` cannot continue this one (EpochSampler's has no kind)."""
    found = state.get("sampler", "uniform")
    if found != kind:
        raise ValueError(f"the checkpoint's data position is for data.sampler={found}, this run has "
                         f"data.sampler={kind}: resume with the same sampler (or trainer.resume=never)")


class _CountedDraws:
    """The data position of a sampler that counts its draws (``draws``, ``batch_size``, ``size``), as the trainer
    reads it from every sampler: ``epoch`` and ``offset``."""

    draws: int
    batch_size: int

    @property
    def epoch(self) -> int:
        """Prompts drawn so far, in whole dataset sizes."""
        return self.draws * self.batch_size // self.size

    @property
    def offset(self) -> int:
        """Prompts drawn so far beyond ``epoch`` dataset sizes."""
        return self.draws * self.batch_size % self.size


class PassRateSampler(_CountedDraws):
    """``data.sampler=pass_rate``: prompts weighted by how informative their estimated pass rate is.

    Rule: with p_i the posterior mean of prompt i's pass rate (``PromptStats.posterior_mean``, the Beta prior
    ``data.pass_rate_prior`` for an unseen prompt), its weight is w_i = max(p_i (1 - p_i), floor): a prompt that
    always or never passes gives GRPO no gradient and is drawn rarely, never less than the ``floor`` allows. A batch
    is ``batch_size`` prompts drawn without replacement, each next one with probability proportional to its weight
    among those not drawn yet (successive sampling; so a batch of 1 holds i with probability w_i / sum(w)). The draw
    uses exponential keys log(u_i) / w_i, u_i from ``random.Random`` seeded by (seed, draw count): the batch is the
    largest keys, in decreasing order. ``data.shuffle`` does not apply. ``epoch``/``offset`` count the prompts drawn
    in units of the dataset size (draws x batch_size = epoch x size + offset).
    """

    def __init__(self, stats: PromptStats, batch_size: int, seed: int, floor: float = 0.02) -> None:
        if batch_size > stats.size:
            raise DataError(f"data.train_batch_size={batch_size} exceeds the {stats.size} prompts available")
        if not 0.0 <= floor <= 0.25:
            raise ValueError(f"data.pass_rate_floor must be in [0, 0.25] (p(1-p) is at most 0.25), got {floor}")
        self.stats, self.batch_size, self.seed, self.floor = stats, batch_size, seed, float(floor)
        self.draws = 0
        self.last_indices: List[int] = []
        self.last_weights: List[float] = []
        """Relative weights N w_i / sum(w) of the last batch at its draw (1: a uniform sampler's)."""

    @property
    def size(self) -> int:
        """Training prompts."""
        return self.stats.size

    def weights(self) -> np.ndarray:
        """w_i = max(p_i (1 - p_i), floor) from the current statistics."""
        p = self.stats.posterior_mean()
        return np.maximum(p * (1.0 - p), self.floor)

    def probabilities(self) -> np.ndarray:
        """Probability of each prompt being the first of the next batch (a whole batch of 1): w_i / sum(w)."""
        w = self.weights()
        return w / w.sum()

    def next_indices(self) -> List[int]:
        """The next batch: ``batch_size`` distinct positions, drawn by the rule above from the current statistics."""
        w = self.weights()
        rng = random.Random(f"pass_rate:{self.seed}:{self.draws}")
        u = 1.0 - np.fromiter((rng.random() for _ in range(self.size)), dtype=np.float64, count=self.size)
        keys = np.log(u) / w  # -Exp(w_i): the largest is i with probability w_i / sum(w), and so on (memoryless)
        order = np.argsort(-keys, kind="stable")[:self.batch_size]
        self.draws += 1
        self.last_indices = order.tolist()
        self.last_weights = (w[order] * self.size / w.sum()).tolist()
        return list(self.last_indices)

    def state_dict(self) -> Dict[str, Any]:
        """The data position (JSON): the number of draws; the statistics are saved by their own ``state_dict``."""
        return {"sampler": "pass_rate", "draws": self.draws}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``'s output; ValueError for another sampler's state."""
        _check_kind(state, "pass_rate")
        self.draws = int(state["draws"])


def largest_remainder(total: int, ratios: Mapping[str, float]) -> Dict[str, int]:
    """Split ``total`` into integer counts proportional to ``ratios``: each gets floor(total x share), then the
    ones with the largest fractional parts get one more until the counts add up (ties: the order of ``ratios``)."""
    mass = sum(ratios.values())
    if not (mass > 0 and all(math.isfinite(r) and r >= 0 for r in ratios.values())):
        raise ValueError(f"data.mixture ratios must be finite, >= 0 and not all 0, got {dict(ratios)}")
    exact = {s: total * r / mass for s, r in ratios.items()}
    counts = {s: int(math.floor(x)) for s, x in exact.items()}
    names = list(ratios)
    by_remainder = sorted(names, key=lambda s: (-(exact[s] - counts[s]), names.index(s)))
    for s in by_remainder[:total - sum(counts.values())]:
        counts[s] += 1
    return counts


class MixtureSampler(_CountedDraws):
    """``data.sampler=mixture``: every batch holds a fixed number of prompts of each data source.

    Rule: the counts are ``largest_remainder(batch_size, data.mixture)`` (the same every batch), and each source
    walks its own epoch order: its prompts (in dataset order) shuffled with ``random.Random`` seeded by (seed,
    source, that source's epoch) when ``shuffle``; a source whose epoch has fewer prompts left than its count starts
    its next epoch (the tail is dropped, as ``EpochSampler`` does). The batch lists the sources in ``data.mixture``
    order. A prompt of source s is in a batch with probability count_s / size_s, on average over its epoch.
    ``epoch``/``offset`` count the prompts drawn in units of the dataset size; ``source_epochs`` has each source's.
    """

    def __init__(self, sources: Sequence[str], batch_size: int, seed: int, ratios: Mapping[str, float],
                 shuffle: bool = True) -> None:
        present: Dict[str, List[int]] = {}
        for pos, s in enumerate(sources):
            present.setdefault(str(s), []).append(pos)
        unknown = [s for s in ratios if s not in present]
        if unknown:
            raise DataError(f"data.mixture names data source(s) {unknown} that no training row has; the training "
                            f"data's sources: {sorted(present)}")
        missing = [s for s in present if s not in ratios]
        if missing:
            raise DataError(f"data.mixture has no ratio for data source(s) {missing} of the training data; give "
                            f"each a ratio (0 leaves it out)")
        self.counts = largest_remainder(batch_size, ratios)
        for s, c in self.counts.items():
            if c > len(present[s]):
                raise DataError(f"data.mixture: {c} prompts of {s!r} per batch, but the training data has only "
                                f"{len(present[s])} of them")
        self.positions = {s: present[s] for s in ratios}
        self.size, self.batch_size, self.seed, self.shuffle = len(sources), batch_size, seed, shuffle
        self.source_epochs = {s: 0 for s in ratios}
        self.source_offsets = {s: 0 for s in ratios}
        self.draws = 0
        self.last_indices: List[int] = []
        self.last_weights: List[float] = []
        """Relative inclusion weights (count_s / size_s) / (batch_size / N) of the last batch (1: uniform's)."""
        self._orders: Dict[Tuple[str, int], List[int]] = {}

    def order(self, source: str, epoch: int) -> List[int]:
        """The dataset positions of ``source`` in the order of its ``epoch``."""
        key = (source, epoch)
        if key not in self._orders:
            order = list(self.positions[source])
            if self.shuffle:
                random.Random(f"mixture:{self.seed}:{source}:{epoch}").shuffle(order)
            self._orders = {k: v for k, v in self._orders.items() if k[0] != source}  # one epoch kept per source
            self._orders[key] = order
        return self._orders[key]

    def inclusion_weights(self) -> Dict[str, float]:
        """Per source: a prompt's chance of being in a batch relative to a uniform sampler's."""
        return {s: (c / len(self.positions[s])) / (self.batch_size / self.size) for s, c in self.counts.items()}

    def next_indices(self) -> List[int]:
        """The next batch: each source's count of prompts, from its epoch order, sources in ``data.mixture`` order."""
        batch: List[int] = []
        weights = self.inclusion_weights()
        for s, count in self.counts.items():
            if not count:
                continue
            if self.source_offsets[s] + count > len(self.positions[s]):
                self.source_epochs[s] += 1
                self.source_offsets[s] = 0
            start = self.source_offsets[s]
            batch += self.order(s, self.source_epochs[s])[start:start + count]
            self.source_offsets[s] = start + count
        self.draws += 1
        self.last_indices = batch
        self.last_weights = [w for s, c in self.counts.items() for w in [weights[s]] * c]
        return list(batch)

    def state_dict(self) -> Dict[str, Any]:
        """The data position (JSON): draws, and [epoch, offset] of each source."""
        return {"sampler": "mixture", "draws": self.draws,
                "sources": {s: [self.source_epochs[s], self.source_offsets[s]] for s in self.counts}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``'s output; ValueError for another sampler's or another mixture's state."""
        _check_kind(state, "mixture")
        if set(state["sources"]) != set(self.counts):
            raise ValueError(f"the checkpoint's mixture has sources {sorted(state['sources'])}, data.mixture has "
                             f"{sorted(self.counts)}")
        self.draws = int(state["draws"])
        for s, (epoch, offset) in state["sources"].items():
            self.source_epochs[s], self.source_offsets[s] = int(epoch), int(offset)


Sampler = Any
"""EpochSampler, PassRateSampler or MixtureSampler: next_indices, epoch, offset, state_dict, load_state_dict."""


def make_sampler(data: Any, rows: Sequence[Dict[str, Any]], seed: int, stats: PromptStats) -> Sampler:
    """The sampler ``data.sampler`` names (``data``: the config's ``DataConfig``) over the training prompts whose
    rows are ``rows`` (their order is the dataset's), with batches of ``data.train_batch_size``."""
    kind = data.sampler
    if kind == "uniform":
        return EpochSampler(len(rows), data.train_batch_size, seed, data.shuffle)
    if stats.size != len(rows):
        raise ValueError(f"prompt statistics for {stats.size} prompts, but {len(rows)} training rows")
    if kind == "pass_rate":
        return PassRateSampler(stats, data.train_batch_size, seed, data.pass_rate_floor)
    if kind == "mixture":
        return MixtureSampler([str(r.get("data_source")) for r in rows], data.train_batch_size, seed,
                              dict(data.mixture), data.shuffle)
    raise ValueError(f"data.sampler={kind!r}: must be one of {', '.join(SAMPLERS)}")


def start_curriculum(data: Any, rows: Sequence[Dict[str, Any]]) -> Tuple[List[int], PromptStats]:
    """Before training: the prompt statistics (seeded from ``data.pass_rate_file`` when given, prior
    ``data.pass_rate_prior``) and the dataset positions to train on (those in ``data.pass_rate_band``; all with the
    default [0, 1]).
    The returned statistics are renumbered to the kept positions."""
    prior = tuple(data.pass_rate_prior)
    if data.pass_rate_file:
        stats = PromptStats.from_eval_samples(data.pass_rate_file, rows, prior)
    else:
        stats = PromptStats(len(rows), prior)
    band = [float(x) for x in data.pass_rate_band]
    if band == [0.0, 1.0]:  # the default: every prompt
        return list(range(len(rows))), stats
    if not data.pass_rate_file:
        raise ValueError("data.pass_rate_band needs data.pass_rate_file (the evaluation that measured the rates)")
    kept = pass_rate_band(stats, band)
    log.info("data.pass_rate_band=%s keeps %d of the %d training prompts (%d of them not measured)", band,
             len(kept), stats.size, int((stats.attempts[kept] == 0).sum()))
    return kept, stats.subset(kept)


def _batch_weights(sampler: Sampler, batch: Sequence[int], drawn_last: bool) -> Sequence[float]:
    """Relative sampling weights (1: uniform's) of ``batch``: those recorded at the draw when it is the sampler's
    last batch, else the current ones."""
    if drawn_last and getattr(sampler, "last_weights", None):
        return sampler.last_weights
    if isinstance(sampler, PassRateSampler):
        w = sampler.weights()
        return w[list(batch)] * sampler.size / w.sum()
    if isinstance(sampler, MixtureSampler):
        by_source = sampler.inclusion_weights()
        source_of = {pos: s for s, positions in sampler.positions.items() for pos in positions}
        return [by_source[source_of[i]] for i in batch]
    return [1.0] * len(batch)


def curriculum_metrics(stats: PromptStats, sampler: Sampler,
                       indices: Optional[Sequence[int]] = None) -> Dict[str, float]:
    """``curriculum/*`` metrics of the statistics and of a batch (``indices``, default ``sampler.last_indices``):

    * ``seen``, ``solved``, ``unsolved``, ``informative``: shares of all prompts with an attempt, whose every attempt
      passed, whose every attempt failed, and with both (the only ones that give GRPO a gradient);
    * ``pass_rate_mean``: mean measured pass rate of the prompts with an attempt (absent when there is none);
    * ``batch_weight_mean``: mean relative sampling weight of the batch (a prompt's chance relative to a uniform
      sampler's: N w_i / sum(w) for pass_rate, recorded when the sampler drew it; 1.0 for uniform);
    * ``batch_informativeness``: mean p(1 - p) of the batch's posterior-mean pass rates, under the current
      statistics (call it before ``stats.update`` with the batch's results to get the values it was drawn with);
    * ``batch_unseen``: share of the batch without an attempt; ``weight_ess`` (pass_rate): the effective share of
      the dataset sampled, (sum w)^2 / (N sum w^2); ``epoch/<source>`` (mixture): each source's epoch.
    """
    n = float(stats.size)
    att, passes = stats.attempts, stats.passes
    seen = att > 0
    out = {"curriculum/seen": float(seen.sum()) / n,
           "curriculum/solved": float((seen & (passes == att)).sum()) / n,
           "curriculum/unsolved": float((seen & (passes == 0)).sum()) / n,
           "curriculum/informative": float((seen & (passes > 0) & (passes < att)).sum()) / n}
    if seen.any():
        out["curriculum/pass_rate_mean"] = float((passes[seen] / att[seen]).mean())
    batch = list(getattr(sampler, "last_indices", []) if indices is None else indices)
    if batch:
        out["curriculum/batch_weight_mean"] = float(np.mean(_batch_weights(sampler, batch, indices is None)))
        p = stats.posterior_mean()[batch]
        out["curriculum/batch_informativeness"] = float((p * (1.0 - p)).mean())
        out["curriculum/batch_unseen"] = float((att[batch] == 0).mean())
    if isinstance(sampler, PassRateSampler):
        w = sampler.weights()
        out["curriculum/weight_ess"] = float(w.sum() ** 2 / (n * (w ** 2).sum()))
    if isinstance(sampler, MixtureSampler):
        out.update({f"curriculum/epoch/{s}": float(e) for s, e in sampler.source_epochs.items()})
    return out
