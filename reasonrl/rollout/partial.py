"""Partial rollouts: generation in segments, with the engine's weights allowed to change between segments.

``SegmentedGenerator`` drives any ``RolloutEngine`` (vLLM or hf) through its ``generate``: each segment generates at
most ``segment_tokens`` new tokens for every unfinished sequence; between segments it asks ``latest_version`` for the
newest weight version and, when that differs from the engine's, calls ``load_version`` (which puts those weights in
the engine, e.g. ``update_weights`` + ``finish_weight_update``). Unfinished sequences then continue from prompt +
their generated prefix with the rest of their token budget: the "stop and continue from the prefix" form of an
in-flight weight update, which every engine supports (vLLM's pause-and-keep calls are not used here).

Every response token records the version of the weights that produced it (``VersionedCompletion.versions``), and,
when the call asks for log-probs, its sampled log-prob under those weights (the behaviour policy of that token).
A sequence ends exactly where a one-shot ``generate`` ends it: on EOS or a stop token (kept, ``stop``), on a stop
string (cut after the token completing the first one in the whole response's text, ``stop``), at
``max_new_tokens`` (``length``), or when the engine gives fewer tokens than a segment asked for without a stop
(its context is full: ``length``). With no version change, greedy segmented generation equals one-shot generation
token for token (tests/unit/rollout/test_partial_rollout.py on vLLM, test_partial_hf.py on hf).

The bookkeeping (``Sequence``, ``segment_budget``, ``absorb``) is pure, so it is tested with hand-derived numbers.
The loop uses it through the fleet's replicas with ``rollout.partial`` (``EngineHost.use_generator``; docs/async.md,
"Partial rollouts"). The installed vLLM also has ``AsyncLLM.pause_generation(mode="keep")``, which keeps the KV cache
of the paused requests; it is not used: that path would need the asynchronous engine in every replica.

``InEngineGenerator`` (``rollout.partial_mode=in_engine``, vLLM only) is the "pause and keep" form on the offline
engine: it steps vLLM's ``LLMEngine`` itself and loads new weights between two steps, the requests staying in the
engine with their KV cache (tests/unit/rollout/test_partial_in_engine.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, List, Optional, Sequence as Seq

from .base import Completion, SamplingParams
from .step_loop import StepLoop


@dataclass
class VersionedCompletion(Completion):
    """A ``Completion`` whose tokens may come from several weight versions."""

    versions: List[int] = field(default_factory=list)
    """The weight version that generated each token of ``token_ids`` (same length, never decreasing)."""
    joined: bool = False
    """Its call's requests joined another call's running engine steps (``step_loop.StepLoop``: in-engine mode)."""

    @property
    def oldest_version(self) -> Optional[int]:
        """The version of the first token (None: no tokens)."""
        return self.versions[0] if self.versions else None

    @property
    def newest_version(self) -> Optional[int]:
        """The version of the last token (None: no tokens)."""
        return self.versions[-1] if self.versions else None


@dataclass
class Sequence:
    """One response being generated: its prompt, what it has so far, and whether it is done."""

    prompt: List[int]
    token_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)
    finish_reason: str = ""
    """"" while unfinished; then ``stop``, ``length`` or the engine's own reason."""

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)


def segment_budget(generated: int, max_new_tokens: int, segment_tokens: int) -> int:
    """How many tokens the next segment may generate for a sequence that has ``generated`` tokens: the rest of its
    budget, at most ``segment_tokens``."""
    return max(0, min(segment_tokens, max_new_tokens - generated))


def absorb(seq: Sequence, piece: Completion, version: int, asked: int, max_new_tokens: int,
           stop_end: Optional[Callable[[List[int]], Optional[int]]] = None, max_len: Optional[int] = None) -> None:
    """Append one segment's output ``piece`` (generated under ``version``, ``asked`` tokens at most) to ``seq`` and
    decide whether it is finished. ``stop_end``: the length of the shortest prefix of a response whose text holds a
    stop string (None: none), applied to the whole response, so a stop string split across two segments is found.
    ``max_len``: the engine's context (prompt + response; None: unbounded); a sequence that fills it ends
    (``length``), as vLLM ends it in one call.
    """
    if seq.done:
        raise ValueError("absorb into a finished sequence")
    n = len(piece.token_ids)
    if n > asked:
        raise ValueError(f"the engine gave {n} tokens for a segment of {asked}")
    seq.token_ids += list(piece.token_ids)
    seq.logprobs += list(piece.logprobs)
    seq.versions += [version] * n
    at = stop_end(seq.token_ids) if stop_end is not None else None
    if at is not None:
        del seq.token_ids[at:], seq.logprobs[at:], seq.versions[at:]
        seq.finish_reason = "stop"
    elif piece.finish_reason != "length":
        seq.finish_reason = piece.finish_reason  # EOS or a stop token (kept), or the engine's own reason
    elif (len(seq.token_ids) >= max_new_tokens or n < asked
          or (max_len is not None and len(seq.prompt) + len(seq.token_ids) >= max_len)):
        seq.finish_reason = "length"  # the budget is spent, or the engine's context is full
    # else: a full segment that ended on its own limit: the sequence continues


class SegmentedGenerator:
    """A generator (``generate(prompt_token_ids, sampling)``, the engine's signature) that generates in segments of
    ``segment_tokens`` and lets the weights change between them.

    ``version``: the weight version the engine holds now. ``latest_version()``: the newest version available; it is
    asked before every segment (the first included), and when it differs from the engine's, ``load_version(v)`` is
    called and later tokens are stamped ``v``. ``tokenizer`` decodes the finished responses and finds stop strings.
    ``self.version`` is the engine's version after each call; ``self.segments`` counts the segments run.
    """

    def __init__(self, engine, tokenizer, segment_tokens: int, version: int,
                 latest_version: Callable[[], int], load_version: Callable[[int], None]) -> None:
        if segment_tokens < 1:
            raise ValueError(f"segment_tokens must be >= 1, got {segment_tokens}")
        self.engine, self.tokenizer, self.segment_tokens = engine, tokenizer, segment_tokens
        self.version = version
        self.latest_version, self.load_version = latest_version, load_version
        self.segments = 0

    def _refresh(self) -> None:
        latest = self.latest_version()
        if latest != self.version:
            self.load_version(latest)
            self.version = latest

    def _stop_end(self, stops: Seq[str]) -> Optional[Callable[[List[int]], Optional[int]]]:
        if not stops:
            return None
        from .hf_engine import first_stop_string_end

        return lambda ids: first_stop_string_end(self.tokenizer, ids, list(stops))

    def generate(self, prompt_token_ids: List[List[int]], sampling: SamplingParams) -> List[List[VersionedCompletion]]:
        """For each prompt, ``sampling.n`` completions in prompt order, like the engine's ``generate``, each with
        the version of every token. The first segment samples ``n`` per prompt; later segments continue each
        unfinished sequence on its own (``n`` = 1)."""
        if not prompt_token_ids:
            return []
        n, budget = sampling.n, sampling.max_new_tokens
        stop_end = self._stop_end(sampling.stop)
        seqs = [Sequence(list(p)) for p in prompt_token_ids for _ in range(n)]
        if budget <= 0:
            for s in seqs:
                s.finish_reason = "length"
        while any(not s.done for s in seqs):
            self._refresh()
            live = [s for s in seqs if not s.done]
            # an unfinished sequence has filled every segment so far, so all of them have the same length
            asked = segment_budget(len(live[0].token_ids), budget, self.segment_tokens)
            seed = None if sampling.seed is None else sampling.seed + self.segments
            if len(live[0].token_ids) == 0:  # the first segment: the n samples of a prompt branch here
                out = self.engine.generate(prompt_token_ids, replace(sampling, max_new_tokens=asked, seed=seed))
            else:  # each unfinished sequence continues from its prompt + prefix, by the rest of its budget
                out = self.engine.generate([s.prompt + s.token_ids for s in live],
                                           replace(sampling, n=1, max_new_tokens=asked, seed=seed))
            pieces = [c for group in out for c in group]
            if len(pieces) != len(live):
                raise RuntimeError(f"the engine gave {len(pieces)} completions for {len(live)} sequences")
            self.segments += 1
            for s, piece in zip(live, pieces):
                absorb(s, piece, self.version, asked, budget, stop_end, getattr(self.engine, "max_model_len", None))
        texts = self.tokenizer.batch_decode([s.token_ids for s in seqs], skip_special_tokens=True)
        done = [VersionedCompletion(s.token_ids, t, s.logprobs if sampling.logprobs else [], s.finish_reason,
                                    s.versions) for s, t in zip(seqs, texts)]
        return [done[i * n:(i + 1) * n] for i in range(len(prompt_token_ids))]


class InEngineGenerator:
    """A generator (the engine's ``generate`` signature) that keeps every request inside vLLM and loads new weights
    between two engine steps (``rollout.partial_mode=in_engine``; ``VLLMRolloutEngine.generate_steps``): a response
    in flight keeps its KV cache and its next token already comes from the new weights, with no new engine call and
    no re-prefill ("pause and keep", where ``SegmentedGenerator`` is "stop and continue from the prefix").

    ``version``, ``latest_version`` and ``load_version`` as for ``SegmentedGenerator``: ``latest_version()`` is asked
    once before the call's requests are added and then before every engine step; when it is newer than the engine's,
    ``load_version(v)`` is called (it loads the weights into the same engine) and the tokens of later steps are
    stamped ``v``. The tokens of a step are stamped with the version the engine held when that step ran (the engine
    runs no step ahead: vLLM's asynchronous scheduling is off in this mode). ``self.steps`` counts the engine steps.

    With ``start`` (``EngineThread.submit``) and ``loaded_version`` (the version the engine holds, however loaded),
    calls share one step loop (``step_loop.StepLoop``, run on the engine's thread by ``start``): a call made while
    another's requests run adds its own between two steps and returns once they are done. Before requests go into an
    engine with none running, the version is read from ``loaded_version()`` and the newest staged weights loaded.
    """

    def __init__(self, engine, version: int, latest_version: Callable[[], int],
                 load_version: Callable[[int], None], start: Optional[Callable[[Callable[[], None]], None]] = None,
                 loaded_version: Optional[Callable[[], int]] = None) -> None:
        self.engine, self.version = engine, version
        self.latest_version, self.load_version = latest_version, load_version
        self.steps = 0
        self.loaded_version = loaded_version
        self.loop = StepLoop(engine.llm, start, self._refresh_idle, self._before_step) if start is not None else None

    def _refresh_idle(self) -> int:
        """The step loop's call before it adds requests to an engine with none running (on the engine's thread)."""
        if self.loaded_version is not None:
            self.version = self.loaded_version()
        version = self._refresh()
        self.engine.ready_for_use()  # a sync finished, the prefix cache dropped if a load in flight made it stale
        return version

    def _refresh(self) -> int:
        latest = self.latest_version()
        if latest > self.version:
            self.load_version(latest)
            self.version = latest
        return self.version

    def _before_step(self) -> int:
        self.steps += 1
        return self._refresh()

    def generate(self, prompt_token_ids: List[List[int]], sampling: SamplingParams) -> List[List[VersionedCompletion]]:
        """For each prompt, ``sampling.n`` completions in prompt order, as the engine's ``generate`` gives them, each
        with the version of every token (log-probs only when the call asks for them)."""
        if not prompt_token_ids:
            return []
        if self.loop is not None:  # the engine's thread runs the loop; this call waits for its own requests
            return self.engine.generate_joined(prompt_token_ids, sampling, self.loop)
        self._refresh()  # before the requests go in: the call starts under the newest weights, its prefix cache reset
        return self.engine.generate_steps(prompt_token_ids, sampling, self._before_step)
