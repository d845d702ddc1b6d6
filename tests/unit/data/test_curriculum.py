"""The curriculum's data part: per-prompt statistics, the uniform / pass_rate / mixture samplers, seeding from an
evaluation's samples.parquet, the pass-rate band, the metrics and the config keys (docs/curriculum.md)."""
from __future__ import annotations

import json
import math
import random
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from reasonrl.config import load_config
from reasonrl.config.load import ConfigError
from reasonrl.data import (EpochSampler, MixtureSampler, PassRateSampler, PromptStats, curriculum_metrics,
                           group_verdicts, largest_remainder, make_sampler, pass_rate_band, start_curriculum)
from reasonrl.data.sample import Round, Sample
from reasonrl.datasets import DataError
from reasonrl.datasets.gsm8k import build_rows as gsm8k_rows
from reasonrl.verifiers import VerifyResult, get_verifier

T, F, X = True, False, None  # X: a response without a verdict


def _stats(counts, prior=(1.0, 1.0)):
    """PromptStats with (attempts, passes) per prompt, recorded at step 1; (0, 0) leaves a prompt unseen."""
    stats = PromptStats(len(counts), prior)
    for i, (attempts, passes) in enumerate(counts):
        if attempts:
            stats.update([i], [[T] * passes + [F] * (attempts - passes)], 1)
    return stats


def _data_cfg(*args):
    return load_config(list(args), cuda_available=False)[0].data


# ---------------------------------------------------------------- PromptStats
def test_update_counts_verdicts_only_and_the_last_step():
    stats = PromptStats(4)
    stats.update([2, 0], [[T, F, X, T], [X, X]], step=3)
    stats.update([2], [[F, F]], step=5)
    assert stats.attempts.tolist() == [0, 0, 5, 0]  # prompt 0: two responses, no verdict: no attempt
    assert stats.passes.tolist() == [0, 0, 2, 0]
    assert stats.last_step.tolist() == [3, -1, 5, -1]  # drawn at step 3 (seen), though never attempted
    # Beta(1, 1) prior: (1 + 2) / (2 + 5) for prompt 2, 1/2 for the others.
    assert stats.posterior_mean().tolist() == pytest.approx([0.5, 0.5, 3 / 7, 0.5])
    rate = stats.pass_rate()
    assert rate[2] == pytest.approx(0.4) and np.isnan(rate[[0, 1, 3]]).all()


def test_update_rejects_bad_input_naming_it():
    stats = PromptStats(3)
    with pytest.raises(ValueError, match="index 3 is not a position in the 3 training prompts"):
        stats.update([3], [[T]], 1)
    with pytest.raises(ValueError, match="2 indices but 1 groups"):
        stats.update([0, 1], [[T]], 1)
    with pytest.raises(ValueError, match="verdict 1.0"):
        stats.update([0], [[1.0]], 1)
    with pytest.raises(ValueError, match="pass_rate_prior"):
        PromptStats(3, prior=(0.0, 1.0))
    assert stats.attempts.tolist() == [0, 0, 0]  # nothing half-recorded


def test_group_verdicts_of_real_verifier_results():
    math_verifier = get_verifier("math")
    results = [math_verifier.verify("so \\boxed{18}", "18"), math_verifier.verify("\\boxed{17}", "18"),
               VerifyResult.failure("verification timed out after 10s", timed_out=True),
               math_verifier.verify("The answer is \\boxed{3/4}", "0.75")]
    samples = [Sample(group=i // 2, response_ids=[], response_text="", rollout_log_probs=[], finish_reason="stop",
                      result=r) for i, r in enumerate(results)]
    assert group_verdicts(Round(["p0", "p1"], samples)) == [[T, F], [X, T]]


def test_state_dict_is_json_compact_and_restores_exactly():
    stats = PromptStats(1000, prior=(2.0, 3.0))
    stats.update([7, 500], [[T, F], [X]], 4)
    state = json.loads(json.dumps(stats.state_dict()))  # what trainer_state.json holds
    assert state == {"version": 1, "size": 1000, "index": [7, 500], "attempts": [2, 0], "passes": [1, 0],
                     "last_step": [4, 4]}  # only the two recorded prompts, not 1000 rows
    again = PromptStats(1000, prior=(2.0, 3.0))
    again.load_state_dict(state)
    for name in ("attempts", "passes", "last_step"):
        assert getattr(again, name).tolist() == getattr(stats, name).tolist()
    with pytest.raises(ValueError, match="for 1000 training prompts, but the dataset has 999"):
        PromptStats(999).load_state_dict(state)


# ---------------------------------------------------------------- pass_rate sampler
# Three prompts, Beta(1, 1) prior, floor 0.02. Posterior means: 8/8 passed -> 9/10; 4/8 -> 5/10; 0/48 -> 1/50.
# p(1-p): 0.09, 0.25, 0.0196 -> floored to 0.02. Sum 0.36, so a batch of 1 holds them with 9/36, 25/36, 2/36.
THREE = [(8, 8), (8, 4), (48, 0)]
FIRST_PICK = [Fraction(9, 36), Fraction(25, 36), Fraction(2, 36)]
# A batch of 2 without replacement (successive sampling): P(i in batch) = pi_i + sum_{j != i} pi_j pi_i / (1 - pi_j).
#   i=0: (9 + 25*9/11 + 2*9/34) / 36 = (9 + 225/11 + 9/17) / 36 = (5607/187) / 36 = 5607/6732
#   i=1: (25 + 9*25/27 + 2*25/34) / 36 = (25/36)(1 + 1/3 + 1/17) = (25/36)(71/51) = 1775/1836
#   i=2: (2 + 9*2/27 + 25*2/11) / 36 = (2 + 2/3 + 50/11) / 36 = (238/33) / 36 = 238/1188
# (they add up to 2, the batch size).
IN_BATCH_OF_2 = [Fraction(5607, 6732), Fraction(1775, 1836), Fraction(238, 1188)]
DRAWS = 20000


def _within_binomial_se(count: int, p: Fraction, draws: int) -> bool:
    """|count/draws - p| within 4 standard errors sqrt(p(1-p)/draws); the draws are seeded, so this never flakes."""
    return abs(count / draws - float(p)) <= 4 * math.sqrt(float(p) * (1 - float(p)) / draws)


def test_pass_rate_probabilities_of_a_batch_of_one_are_the_hand_derived_ones():
    sampler = PassRateSampler(_stats(THREE), batch_size=1, seed=5, floor=0.02)
    assert sampler.weights().tolist() == pytest.approx([0.09, 0.25, 0.02])
    assert sampler.probabilities().tolist() == pytest.approx([float(p) for p in FIRST_PICK])
    counts = np.bincount([sampler.next_indices()[0] for _ in range(DRAWS)], minlength=3)
    assert all(_within_binomial_se(int(c), p, DRAWS) for c, p in zip(counts, FIRST_PICK)), counts


def test_pass_rate_batch_of_two_is_drawn_without_replacement():
    sampler = PassRateSampler(_stats(THREE), batch_size=2, seed=11, floor=0.02)
    counts, firsts = np.zeros(3, dtype=int), np.zeros(3, dtype=int)
    for _ in range(DRAWS):
        batch = sampler.next_indices()
        assert len(set(batch)) == 2
        counts[batch] += 1
        firsts[batch[0]] += 1
    assert all(_within_binomial_se(int(c), p, DRAWS) for c, p in zip(counts, IN_BATCH_OF_2)), counts
    assert all(_within_binomial_se(int(c), p, DRAWS) for c, p in zip(firsts, FIRST_PICK)), firsts


def test_unseen_prompts_use_the_prior_and_the_floor_keeps_every_prompt_drawable():
    # Prior Beta(1, 3): unseen -> p = 1/4, p(1-p) = 3/16. 30 of 30 passed: p = 31/34, p(1-p) = 93/1156 ~ 0.080.
    sampler = PassRateSampler(_stats([(0, 0), (30, 30)], prior=(1.0, 3.0)), batch_size=1, seed=0, floor=0.1)
    assert sampler.weights().tolist() == pytest.approx([3 / 16, 0.1])  # 0.080 is below the floor
    assert sampler.probabilities().tolist() == pytest.approx([(3 / 16) / (3 / 16 + 0.1), 0.1 / (3 / 16 + 0.1)])


def test_pass_rate_draws_resume_exactly_and_ignore_the_global_rng():
    def run(interrupt_at=None):
        stats = PromptStats(50)
        sampler = PassRateSampler(stats, batch_size=8, seed=3)
        batches = []
        for step in range(1, 7):
            if step == interrupt_at:  # a new process: fresh objects from the checkpoint's JSON
                saved = json.loads(json.dumps({"sampler": sampler.state_dict(), "stats": stats.state_dict()}))
                stats = PromptStats(50)
                sampler = PassRateSampler(stats, batch_size=8, seed=3)
                sampler.load_state_dict(saved["sampler"])
                stats.load_state_dict(saved["stats"])
                random.seed(12345)
                np.random.seed(12345)
            batch = sampler.next_indices()
            batches.append(batch)
            stats.update(batch, [[i % 3 == 0, i % 5 == 0] for i in batch], step)  # stats steer the next draws
        return batches

    straight = run()
    assert run(interrupt_at=4) == straight
    assert len({tuple(b) for b in straight}) == 6
    assert (PassRateSampler(PromptStats(50), 8, seed=3).epoch, PassRateSampler(PromptStats(50), 8, seed=3).offset) \
        == (0, 0)
    s = PassRateSampler(PromptStats(50), 8, seed=3)
    s.load_state_dict({"sampler": "pass_rate", "draws": 7})  # 56 prompts drawn of 50: epoch 1, offset 6
    assert (s.epoch, s.offset) == (1, 6)
    with pytest.raises(ValueError, match="data.sampler=uniform, this run has data.sampler=pass_rate"):
        s.load_state_dict({"epoch": 0, "offset": 8})  # an EpochSampler's checkpoint


# ---------------------------------------------------------------- mixture sampler
def test_largest_remainder_counts():
    # 8 x (0.5, 0.3, 0.2) = 4, 2.4, 1.6: floors 4, 2, 1 (7); the one left goes to c (remainder 0.6 > 0.4).
    assert largest_remainder(8, {"a": 0.5, "b": 0.3, "c": 0.2}) == {"a": 4, "b": 2, "c": 2}
    # 10 / 3 each: floors 3, 3, 3; equal remainders: the first listed gets the one left.
    assert largest_remainder(10, {"x": 1, "y": 1, "z": 1}) == {"x": 4, "y": 3, "z": 3}
    assert largest_remainder(5, {"a": 2, "b": 0}) == {"a": 5, "b": 0}
    with pytest.raises(ValueError, match="not all 0"):
        largest_remainder(4, {"a": 0})


SOURCES = ["a", "b", "c", "a", "b", "c", "a", "b", "c", "a", "b", "c", "a", "b", "a"]  # a: 6, b: 5, c: 4 rows


def test_mixture_batches_hold_the_counts_and_each_source_walks_its_own_epochs():
    # batch 5, ratios 2:2:1 -> counts 2, 2, 1. Over 12 batches: a (6 rows, 2 per batch) covers 4 epochs, each row
    # 4 times; c (4 rows, 1 per batch) 3 epochs, each row 3 times; b (5 rows, 2 per batch) 6 epochs of 2 batches,
    # each epoch 4 of its 5 rows (the tail of 1 is dropped).
    sampler = MixtureSampler(SOURCES, batch_size=5, seed=2, ratios={"a": 2, "b": 2, "c": 1})
    batches = [sampler.next_indices() for _ in range(12)]
    for batch in batches:
        assert [SOURCES[i] for i in batch] == ["a", "a", "b", "b", "c"]
    uses = np.bincount([i for b in batches for i in b], minlength=len(SOURCES))
    assert all(uses[i] == 4 for i, s in enumerate(SOURCES) if s == "a")
    assert all(uses[i] == 3 for i, s in enumerate(SOURCES) if s == "c")
    for epoch in range(6):  # b's epochs: batches 2e and 2e+1, four distinct rows
        rows = batches[2 * epoch][2:4] + batches[2 * epoch + 1][2:4]
        assert len(set(rows)) == 4
    assert sampler.source_epochs == {"a": 3, "b": 5, "c": 2}  # 0-based: the epoch each is in
    # A prompt's chance per batch relative to uniform (5/15): a 2/6, b 2/5, c 1/4 -> 1, 1.2, 0.75.
    assert sampler.inclusion_weights() == pytest.approx({"a": 1.0, "b": 1.2, "c": 0.75})
    assert sampler.last_weights == pytest.approx([1.0, 1.0, 1.2, 1.2, 0.75])


def test_mixture_resumes_exactly_and_refuses_a_mismatched_mixture():
    make = lambda: MixtureSampler(SOURCES, batch_size=5, seed=9, ratios={"a": 2, "b": 2, "c": 1})  # noqa: E731
    straight = make()
    expected = [straight.next_indices() for _ in range(9)]
    first = make()
    got = [first.next_indices() for _ in range(4)]
    state = json.loads(json.dumps(first.state_dict()))
    second = make()
    second.load_state_dict(state)
    got += [second.next_indices() for _ in range(5)]
    assert got == expected
    with pytest.raises(ValueError, match="the checkpoint's mixture has sources"):
        MixtureSampler(SOURCES, 5, 9, {"a": 1, "b": 1, "c": 0}).load_state_dict(
            {"sampler": "mixture", "draws": 1, "sources": {"a": [0, 2], "b": [0, 2]}})


def test_mixture_input_errors_name_the_source():
    with pytest.raises(DataError, match=r"no ratio for data source\(s\) \['c'\]"):
        MixtureSampler(SOURCES, 5, 0, {"a": 1, "b": 1})
    with pytest.raises(DataError, match=r"\['d'\] that no training row has"):
        MixtureSampler(SOURCES, 5, 0, {"a": 1, "b": 1, "c": 1, "d": 1})
    with pytest.raises(DataError, match="5 prompts of 'c' per batch, but the training data has only 4"):
        MixtureSampler(SOURCES, 5, 0, {"a": 0, "b": 0, "c": 1})
    unshuffled = MixtureSampler(SOURCES, 3, 0, {"a": 1, "b": 0, "c": 0}, shuffle=False)
    assert unshuffled.next_indices() == [0, 3, 6] and unshuffled.next_indices() == [9, 12, 14]


# ---------------------------------------------------------------- make_sampler and uniform
SEEDS = 3000


def test_uniform_and_mixture_epoch_probabilities_over_seeds():
    # uniform, 15 prompts, batches of 4: an epoch is 3 batches (12 prompts, the tail of 3 dropped), so over seeds a
    # prompt is in epoch 0 with probability 12/15 and first in it with 1/15; within one seed, never twice.
    in_epoch, first = np.zeros(15, dtype=int), np.zeros(15, dtype=int)
    for seed in range(SEEDS):
        sampler = EpochSampler(15, 4, seed)
        epoch = [i for _ in range(3) for i in sampler.next_indices()]
        assert len(set(epoch)) == 12 and sampler.epoch == 0
        in_epoch[epoch] += 1
        first[epoch[0]] += 1
    assert all(_within_binomial_se(int(c), Fraction(12, 15), SEEDS) for c in in_epoch), in_epoch
    assert all(_within_binomial_se(int(c), Fraction(1, 15), SEEDS) for c in first), first
    # mixture: b has 5 prompts and 2 per batch, so its epoch is 2 batches holding 4 of them: 4/5 each over seeds.
    b_rows = [i for i, s in enumerate(SOURCES) if s == "b"]
    in_b_epoch = np.zeros(len(SOURCES), dtype=int)
    for seed in range(SEEDS):
        sampler = MixtureSampler(SOURCES, 5, seed, {"a": 2, "b": 2, "c": 1})
        in_b_epoch[[i for _ in range(2) for i in sampler.next_indices() if SOURCES[i] == "b"]] += 1
    assert all(_within_binomial_se(int(in_b_epoch[i]), Fraction(4, 5), SEEDS) for i in b_rows), in_b_epoch


def test_uniform_is_todays_epoch_sampler_and_the_others_come_from_the_config():
    rows = [{"data_source": s} for s in SOURCES]
    cfg = _data_cfg("data.train_batch_size=4")
    uniform = make_sampler(cfg, rows, seed=1, stats=PromptStats(len(rows)))
    reference = EpochSampler(len(rows), 4, 1, True)
    assert type(uniform) is EpochSampler
    assert [uniform.next_indices() for _ in range(7)] == [reference.next_indices() for _ in range(7)]
    assert uniform.last_indices == reference.last_indices and uniform.state_dict() == {"epoch": 2, "offset": 4}
    pass_rate = make_sampler(_data_cfg("data.train_batch_size=4", "data.sampler=pass_rate",
                                       "data.pass_rate_floor=0.05"), rows, 1, PromptStats(len(rows)))
    assert isinstance(pass_rate, PassRateSampler) and pass_rate.floor == 0.05
    mixture = make_sampler(_data_cfg("data.train_batch_size=4", "data.sampler=mixture",
                                     "data.mixture={a: 1, b: 1, c: 2}"), rows, 1, PromptStats(len(rows)))
    assert isinstance(mixture, MixtureSampler) and mixture.counts == {"a": 1, "b": 1, "c": 2}


# ---------------------------------------------------------------- seeding from an evaluation
def _eval_table(tmp_path, rows, verdicts):
    """samples.parquet as python -m reasonrl.eval writes it: its problem_record and SampleStore, real results."""
    from reasonrl.eval.runner import problem_record
    from reasonrl.eval.store import SampleStore
    from reasonrl.rollout.base import Completion

    math_verifier = get_verifier("math")
    records = []
    for problem, (row, flags) in enumerate(zip(rows, verdicts)):
        gold = row["reward_model"]["ground_truth"]
        texts = [f"\\boxed{{{gold if f else gold + '1'}}}" for f in flags]
        results = [VerifyResult.failure("worker died") if f is None else math_verifier.verify(t, gold)
                   for f, t in zip(flags, texts)]
        completions = [Completion([1, 2], t, [], "stop") for t in texts]
        records.append(problem_record(problem, [problem], row, completions, results))
    store = SampleStore(str(tmp_path / "eval"))
    store.append(records)
    return store.write_parquet(records)


@pytest.fixture(scope="module")
def gsm8k(data_dir):
    return {"train": gsm8k_rows("train", data_dir)[:6], "test": gsm8k_rows("test", data_dir)[:3]}


def test_from_eval_samples_matches_by_index_and_question(tmp_path, gsm8k):
    train = gsm8k["train"]
    no_index = dict(train[4], extra_info={"split": "train"})  # matched by its question alone
    evaluated = [train[0], train[2], no_index, gsm8k["test"][1]]  # test index 1: same key as train[1], other text
    path = _eval_table(tmp_path, evaluated, [[T, T, F, X], [F, F], [T], [T, T]])
    stats = PromptStats.from_eval_samples(str(path), train)
    assert stats.attempts.tolist() == [3, 0, 2, 0, 1, 0]  # the failed sample of train[0] is no attempt
    assert stats.passes.tolist() == [2, 0, 0, 0, 1, 0]
    assert stats.last_step.tolist() == [0, -1, 0, -1, 0, -1]
    assert stats.seeded_from["matched"] == 3 and stats.seeded_from["conflicts"] == 1
    # The output directory and the samples.jsonl checkpoint give the same statistics.
    for source in (path.parent, path.parent / "samples.jsonl"):
        assert PromptStats.from_eval_samples(str(source), train).passes.tolist() == stats.passes.tolist()


def test_from_eval_samples_errors_name_the_file(tmp_path, gsm8k):
    path = _eval_table(tmp_path, gsm8k["test"], [[T], [F], [T]])
    with pytest.raises(DataError, match=rf"{path}: none of its 3 problems matches one of the 6 training prompts"
                                        rf".*evaluated on another split\? use eval.split=train"):
        PromptStats.from_eval_samples(str(path), gsm8k["train"])
    with pytest.raises(DataError, match="data.pass_rate_file=.*nowhere.parquet: no such file"):
        PromptStats.from_eval_samples(str(tmp_path / "nowhere.parquet"), gsm8k["train"])
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="junk.parquet: cannot be read as evaluation samples"):
        PromptStats.from_eval_samples(str(tmp_path / "junk.parquet"), gsm8k["train"])


def test_pass_rate_band_and_start_curriculum(tmp_path, gsm8k):
    train = gsm8k["train"]
    # Measured: train[0] 2/3, train[1] 0/2, train[2] 2/2, train[3] 1/4; train[4], train[5] not evaluated.
    path = _eval_table(tmp_path, train[:4], [[T, T, F], [F, F], [T, T], [T, F, F, F]])
    stats = PromptStats.from_eval_samples(str(path), train)
    assert pass_rate_band(stats, [0.25, 0.7]) == [0, 3, 4, 5]  # 2/3 and 1/4 in band; unmeasured kept
    assert pass_rate_band(stats, [0.25, 0.7], keep_unmeasured=False) == [0, 3]
    with pytest.raises(DataError, match=r"pass_rate_band=\[0.8, 0.9\] keeps none of the 6"):
        pass_rate_band(stats, [0.8, 0.9], keep_unmeasured=False)
    cfg = _data_cfg(f"data.pass_rate_file={path}", "data.pass_rate_band=[0.25,0.7]", "data.sampler=pass_rate",
                    "data.train_batch_size=2")
    kept, started = start_curriculum(cfg, train)
    assert kept == [0, 3, 4, 5]
    assert started.size == 4 and started.attempts.tolist() == [3, 4, 0, 0] and started.passes.tolist() == [2, 1, 0, 0]
    sampler = make_sampler(cfg, [train[i] for i in kept], seed=0, stats=started)
    # Beta(1,1): 3/5 -> 0.24, 2/6 -> 2/9, unseen 1/2 -> 0.25 (twice); none below the 0.02 floor.
    assert sampler.weights().tolist() == pytest.approx([0.24, 2 / 9, 0.25, 0.25])
    plain_kept, plain = start_curriculum(_data_cfg(), train)
    assert plain_kept == list(range(6)) and plain.attempts.sum() == 0


# ---------------------------------------------------------------- metrics
def test_curriculum_metrics_by_hand():
    # Prompts: 8/8 (solved), 0/8 (unsolved), 4/8 (informative), unseen. Posterior means (Beta(1,1)): 9/10, 1/10,
    # 5/10, 1/2.
    stats = _stats([(8, 8), (8, 0), (8, 4), (0, 0)])
    uniform = EpochSampler(4, 2, seed=0)
    uniform.next_indices()
    m = curriculum_metrics(stats, uniform, indices=[1, 3])
    assert m == pytest.approx({
        "curriculum/seen": 0.75, "curriculum/solved": 0.25, "curriculum/unsolved": 0.25,
        "curriculum/informative": 0.25, "curriculum/pass_rate_mean": 0.5,  # (1 + 0 + 0.5) / 3
        "curriculum/batch_weight_mean": 1.0,
        "curriculum/batch_informativeness": (0.09 + 0.25) / 2,  # p(1-p) of 1/10 and 1/2
        "curriculum/batch_unseen": 0.5})
    pass_rate = PassRateSampler(stats, batch_size=2, seed=0, floor=0.02)
    # Weights 0.09, 0.09, 0.25, 0.25 (sum 0.68): relative weights 4 w / 0.68 = 0.529, 0.529, 1.471, 1.471.
    batch = pass_rate.next_indices()
    m = curriculum_metrics(stats, pass_rate)
    relative = {0: 0.36 / 0.68, 1: 0.36 / 0.68, 2: 1.0 / 0.68, 3: 1.0 / 0.68}
    assert m["curriculum/batch_weight_mean"] == pytest.approx(sum(relative[i] for i in batch) / 2)
    # ESS share: 0.68^2 / (4 (2 x 0.0081 + 2 x 0.0625)) = 0.4624 / 0.5648.
    assert m["curriculum/weight_ess"] == pytest.approx(0.4624 / 0.5648)
    empty = curriculum_metrics(PromptStats(3), EpochSampler(3, 1, 0))
    assert "curriculum/pass_rate_mean" not in empty and "curriculum/batch_weight_mean" not in empty
    mixture = MixtureSampler(SOURCES, 5, 0, {"a": 2, "b": 2, "c": 1})
    mixture.next_indices()
    m = curriculum_metrics(PromptStats(len(SOURCES)), mixture)
    assert m["curriculum/batch_weight_mean"] == pytest.approx((1 + 1 + 1.2 + 1.2 + 0.75) / 5)
    assert m["curriculum/epoch/a"] == 0.0


# ---------------------------------------------------------------- config keys
def test_config_keys_are_validated_naming_the_key():
    cfg = _data_cfg("data.sampler=mixture", "data.mixture={openai/gsm8k: 3, mbpp: 1}")
    assert cfg.mixture == {"openai/gsm8k": 3.0, "mbpp": 1.0}
    default = _data_cfg()
    assert (default.sampler, default.pass_rate_prior, default.pass_rate_band) == ("uniform", [1.0, 1.0], [0.0, 1.0])
    bad = {("data.sampler=easy_first",): "data.sampler': must be uniform, pass_rate or mixture",
           ("data.sampler=mixture",): "data.mixture': must give a ratio per data_source",
           ("data.mixture={a: 1}",): "data.mixture': is only read with data.sampler=mixture",
           ("data.sampler=mixture", "data.mixture={a: 0}"): "data.mixture': ratios must be finite, >= 0 and not all 0",
           ("data.pass_rate_band=[0.1,0.9]",): "data.pass_rate_band': needs data.pass_rate_file",
           ("data.pass_rate_band=[0.9,0.1]", "data.pass_rate_file=x"): "data.pass_rate_band': must be \\[lo, hi\\]",
           ("data.pass_rate_band=[0,2]", "data.pass_rate_file=x"): "data.pass_rate_band': 2.0 is out of range",
           ("data.pass_rate_floor=0.3",): "data.pass_rate_floor': 0.3 is out of range; allowed: \\[0, 0.25\\]",
           ("data.pass_rate_prior=[0,1]",): "data.pass_rate_prior': 0.0 is out of range",
           ("data.pass_rate_prior=[1]",): "data.pass_rate_prior': must be two positive numbers"}
    for args, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            _data_cfg(*args)


def test_start_curriculum_needs_the_file_for_a_band():
    with pytest.raises(ValueError, match="needs data.pass_rate_file"):
        start_curriculum(SimpleNamespace(pass_rate_prior=[1, 1], pass_rate_file=None, pass_rate_band=[0.2, 1]),
                         [{"data_source": "a"}])


# ---------------------------------------------------------------- the real evaluation command
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_statistics_seeded_from_the_real_eval_command(tmp_path):
    """``python -m reasonrl.eval`` (SmolLM2-135M, hf engine) on the first arith training problems; its samples.parquet
    seeds the statistics of the training rows, and is refused for the test rows (same keys, other questions)."""
    import os
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from reasonrl.datasets import read_rows, task_files

    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "reasonrl.eval", "task=arith", "eval.split=train", "eval.limit=3", "eval.n=2",
           "eval.temperature=1.0", "eval.max_new_tokens=16", "rollout.engine=hf", "reward.workers=1",
           f"eval.output_dir={out}"]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = [row for f in task_files("arith", "train") for row in read_rows(f)]
    stats = PromptStats.from_eval_samples(str(out), train)
    table = pq.read_table(out / "samples.parquet").to_pylist()
    assert stats.seeded_from["matched"] == 3
    for record in table:  # extra_info.index is the row's position in the arith training file
        i = record["index"]
        verdicts = [c for c, f in zip(record["correct"], record["failed"]) if not f]
        assert (stats.attempts[i], stats.passes[i]) == (len(verdicts), sum(verdicts))
    assert int(stats.attempts.sum()) == sum(sum(not f for f in r["failed"]) for r in table)
    test_rows = [row for f in task_files("arith", "val") for row in read_rows(f)]
    with pytest.raises(DataError, match="evaluated on another split"):
        PromptStats.from_eval_samples(str(out), test_rows)
