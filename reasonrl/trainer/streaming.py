"""One round's rollout + verify, as Samples; with rewards while generating when asked.

``generate_and_verify`` is the rollout + verify of one round. With ``rollout.stream_chunk_prompts`` > 0 every engine
generates its share in sub-batches (``group.stream`` starts them, ``group.iter_stream`` yields each finished
sub-batch with its engine) and each sub-batch's responses go to the pool (``VerifierPool.submit``) the moment they
arrive, so verifying overlaps generating; ``timing_s/verify`` is then only what is left after the last response. With 0
it is one generate call, then one ``verify_batch``. Either way the Samples come back in the order of one plain
generate call (engine by engine, prompt by prompt), each with its verifier and result. The engines return Samples
that carry their group (the prompt's position in the round, handed over with the prompts); here each is bound to its
prompt. The group is a Ray
``WorkerGroup`` or an in-process one (``controller.in_process``): both give the same calls.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from reasonrl.data.batch import Batch
from reasonrl.data.sample import Sample, attach_results, bind_prompts
from reasonrl.rewards import verifier_for, verify_item

from .metrics import PhaseTimer


def prompt_batch(prompts: Sequence[Any]) -> Batch:
    """What the engines are handed: each prompt's token ids (meta ``prompt_ids``), its dataset row (meta ``rows``,
    ``engine_host.PROMPT_ROWS``), which the multi-turn loop resets the row's environment with, and its group id (meta
    ``groups``, ``engine_host.PROMPT_GROUPS``: its position in ``prompts``), which its Samples carry."""
    return Batch(meta={"prompt_ids": [p.token_ids for p in prompts], "rows": [p.row for p in prompts],
                       "groups": list(range(len(prompts)))})


def generate_and_verify(group, prompts: Sequence[Any], sampling: Dict[str, Any], pool, reward_cfg,
                        chunk_prompts: int, timer: PhaseTimer) -> List[Sample]:
    """Responses (``sampling["n"]`` per prompt, grouped) as verified Samples; times ``rollout`` and ``verify``."""
    if chunk_prompts <= 0:
        with timer("rollout"):
            samples = bind_prompts(group.generate(prompt_batch(prompts), sampling), prompts)
        with timer("verify"):
            return verify(samples, pool, reward_cfg)
    return collect_stream(group, group.stream("generate_stream", prompt_batch(prompts), sampling, chunk_prompts),
                          prompts, pool, reward_cfg, timer)


def verify(samples: List[Sample], pool, reward_cfg) -> List[Sample]:
    """``samples`` scored in one batch by the verifier pool, each environment's failure recorded on its sample."""
    items = reward_items(samples, reward_cfg)
    attach_results(samples, items, pool.verify_batch(items))
    return mark_env_failures(samples)


def reward_items(samples: List[Sample], reward_cfg) -> List[Any]:
    """Each sample's item for the reward router; the name its reward is logged under (``reward/<name>/...``: its
    verifier, a reward source, or a combination) is set on the sample here, once."""
    for s in samples:
        s.verifier = verifier_for(s.prompt.row, reward_cfg)
    return [verify_item(s.prompt.row, s.response_text, reward_cfg) for s in samples]


def collect_stream(group, streams: List[Any], prompts: Sequence[Any], pool, reward_cfg,
                   timer: PhaseTimer) -> List[Sample]:
    """Read the engines' sub-batches as they come (``group.iter_stream``), submitting each to the pool at once; then
    wait for the results."""
    pieces: List[List[List[Sample]]] = [[] for _ in range(group.engines)]
    submitted: List[tuple] = []
    with timer("rollout"):
        for engine, part in group.iter_stream(streams):
            samples = bind_prompts(part, prompts)
            items = reward_items(samples, reward_cfg)
            submitted.append((samples, items, pool.submit(items)))
            pieces[engine].append(samples)
    with timer("verify"):  # only what verification has left once the last response is in
        for samples, items, submission in submitted:
            attach_results(samples, items, submission.result())
    return mark_env_failures([s for engine in pieces for part in engine for s in part])


def mark_env_failures(samples: List[Sample]) -> List[Sample]:
    """A sample whose environment crashed or hung (``Sample.env.failed``) has no verdict: its result becomes a
    failure naming the environment (left out of the advantages and the loss, counted)."""
    from reasonrl.envs.metrics import env_failure

    for s in samples:
        if s.env is not None and s.env.failed:
            s.result = env_failure(s.env.name, s.env.failed)
    return samples


def generate_verified(engines, prompts: Sequence[Any], sampling: Dict[str, Any], pool, reward_cfg) -> List[Sample]:
    """One response per prompt from the worker group ``engines`` (padded so every engine gets the same count),
    verified; the padding is dropped."""
    real = list(prompts)
    padded = real + [real[-1]] * ((-len(real)) % engines.engines)
    samples = [s for s in bind_prompts(engines.generate(prompt_batch(padded), sampling), padded)
               if s.group < len(real)]
    return verify(samples, pool, reward_cfg)


def poison_samples(group: int, n: int, prompt: Any, reason: str, version: int, reward_cfg: Any) -> List[Any]:
    """The ``n`` samples of a poison prompt (``fleet.poison``): no response, each a recorded failure with ``reason``
    (left out of the advantages and the loss, never scored 0), stamped with the fleet's weight ``version``."""
    from reasonrl.verifiers import VerifyResult

    return [Sample(group=group, response_ids=[], response_text="", rollout_log_probs=[], finish_reason="error",
                   weights_version=version, prompt=prompt, verifier=verifier_for(prompt.row, reward_cfg),
                   result=VerifyResult.failure(reason, poison=True)) for _ in range(n)]

