"""The version lag the off-policy metrics split by: per sample, or per token for partial rollouts."""
from __future__ import annotations

import torch

from reasonrl.data.batch import Batch
from reasonrl.data.sample import Sample
from reasonrl.trainer.metrics import partial_rollout_metrics, with_version_lag


def sample(n_tokens: int, version: int, token_versions=None) -> Sample:
    s = Sample(group=0, response_ids=list(range(n_tokens)), response_text="", rollout_log_probs=[0.0] * n_tokens,
               finish_reason="stop")
    s.weights_version = version
    if token_versions is not None:
        s.token_versions, s.oldest_version, s.newest_version = token_versions, token_versions[0], token_versions[-1]
    return s


def test_whole_responses_get_one_lag_each():
    batch = with_version_lag(Batch({"response_mask": torch.ones(2, 3)}), [sample(3, 2), sample(1, 3)], step=3)
    assert batch["version_lag"].tolist() == [1, 0]


def test_a_partial_rollout_gets_a_lag_per_token_and_padding_its_oldest():
    """Step 3: a response whose tokens came from versions 1, 1, 2, 3 (lags 2, 2, 1, 0), a whole response of version 2
    (lag 1 on all its 4 columns), and a partial one of 2 tokens at version 3 padded to 4 with its oldest (lag 0)."""
    samples = [sample(4, 1, [1, 1, 2, 3]), sample(2, 2), sample(2, 3, [3, 3])]
    batch = with_version_lag(Batch({"response_mask": torch.ones(3, 4)}), samples, step=3)
    assert batch["version_lag"].tolist() == [[2, 2, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]


def test_samples_without_versions_get_no_lag():
    s = sample(2, 0)
    s.weights_version = None
    assert "version_lag" not in with_version_lag(Batch({"response_mask": torch.ones(1, 2)}), [s], step=1)


def test_partial_rollout_metrics_count_the_samples_and_tokens_carried_across_a_load():
    """Versions [1, 1, 2, 3] (spans; 2 of its 4 tokens newer than its first), [3, 3] (does not span), and one whole
    response with no per-token versions: 1 of the 3 samples spans, and 2 of the 6 recorded tokens are newer."""
    samples = [sample(4, 1, [1, 1, 2, 3]), sample(2, 3, [3, 3]), sample(5, 2)]
    assert partial_rollout_metrics(samples) == {"rollout/partial_spanning_frac": 1 / 3,
                                                "rollout/partial_newer_token_frac": 2 / 6,
                                                "rollout/partial_joined_frac": 0.0}
    samples[1].joined_running = True  # its call joined another's running engine steps: 1 sample of 3
    assert partial_rollout_metrics(samples)["rollout/partial_joined_frac"] == 1 / 3


def test_partial_rollout_metrics_are_absent_without_per_token_versions():
    assert partial_rollout_metrics([sample(3, 2), sample(1, 3)]) == {}
