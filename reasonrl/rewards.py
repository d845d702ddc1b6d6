"""From a dataset row and a response to a VerifierPool item (shared by training and evaluation)."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from reasonrl.config.schema import RewardConfig
from reasonrl.config.tasks import verifier_for_data_source

def verifier_for(row: Dict[str, Any], reward: RewardConfig) -> str:
    """The verifier that scores ``row``: ``reward.verifier`` when the user forces one, else the row's ``verifier``
    column, else the task registry's verifier for its ``data_source``."""
    if reward.verifier:
        return reward.verifier
    if row.get("verifier"):
        return row["verifier"]
    source = row.get("data_source", "")
    verifier = verifier_for_data_source(source)
    if verifier is not None:
        return verifier
    raise ValueError(f"no verifier for data_source {source!r}: add a 'verifier' column or set reward.verifier=")


def check_verifiers(rows: Sequence[Dict[str, Any]], reward: RewardConfig, what: str) -> List[str]:
    """Before anything loads: every row of ``what`` (a data split) resolves to a verifier that is registered (built
    in or installed through the entry-point group); DataError naming the first row that does not. Returns the
    verifiers the rows use, sorted."""
    from reasonrl.datasets import DataError
    from reasonrl.verifiers import available_verifiers

    known, used = set(available_verifiers()), set()
    for i, row in enumerate(rows):
        try:
            name = verifier_for(row, reward)
        except ValueError as exc:
            raise DataError(f"{what}: row {i}: {exc}") from None
        if name not in known:
            source = "reward.verifier" if reward.verifier else f"row {i} (data_source {row.get('data_source')!r})"
            raise DataError(f"{what}: {source} names the verifier {name!r}, which is not registered; known: "
                            f"{', '.join(sorted(known))} (plugins register through the 'reasonrl.verifiers' "
                            f"entry-point group)")
        used.add(name)
    return sorted(used)


def verify_item(row: Dict[str, Any], response: str, reward: RewardConfig) -> Tuple[str, str, Any, Dict[str, Any]]:
    """``(verifier, response, ground_truth, extra)`` for ``VerifierPool.verify_batch``."""
    extra = {k: v for k, v in (row.get("extra_info") or {}).items() if v is not None}
    return verifier_for(row, reward), response, row["reward_model"]["ground_truth"], extra


def make_pool(reward: RewardConfig):
    """The VerifierPool a run uses, built from the ``reward`` section of its config."""
    from reasonrl.verifiers import VerifierPool

    return VerifierPool(workers=reward.workers, timeout_s=reward.timeout_s,
                        verifier_options=dict(reward.verifier_options) or None, score_range=reward.score_range)
