"""A poison prompt told apart from a broken replica: pure bookkeeping of the fleet's ``generate`` calls that failed,
either because the call *raised* (the replica's process lives and its method raised) or because the replica was
*lost* with the call running (its process died, or it hung past the watchdog).

A replica whose call fails may be broken, or may have been handed a prompt that makes any replica fail (a poison
prompt: one that raises in every engine, or crashes the engine's process, an out-of-memory on a very long prompt, a
device fault). Answering the second as the first is wrong: the prompt fails on every replica, each failure costs a
restart, and the run stops when the budget is spent. So both failures share one record per prompt:

- the prompts of the failed call are *isolated*: each is issued again alone (one prompt per call) until it is
  answered (after a raise, on another replica than the one that raised when another takes work; after a loss the
  lost replica has left the router anyway);
- a prompt's record lists the distinct replicas (name and generation: a replica and its replacement count as 2) whose
  call held it when it failed: a raised call counts only when the prompt was alone in it (a call that raised with
  others says nothing of which prompt raised, and costs no restart), a lost replica's running call counts with or
  without others (each loss costs a restart: the evidence starts at the first). A prompt that fails *alone* in its
  call and whose record then holds 2 distinct replicas is poison: it is not issued again, its samples become recorded
  failures with a reason that names the replicas and the last cause (dropped in the ledger when the round is
  trained), and every raise it explains is struck off the replicas' records. A prompt that raised alone once and
  then killed a replica alone is poison too, as is one held by a replica that died and then raising alone elsewhere;
- a replica is charged a *strike* for each call that raised and no poison prompt explains; a success clears its
  strikes; at ``max_strikes`` strikes in a row it is replaced (the caller books the restart, as for a death). A broken
  replica thus still ends replaced (it raises on distinct prompts, which then answer elsewhere), a healthy replica that
  met a poison prompt does not. A lost replica is replaced whatever its prompts (it really is gone): a prompt that
  kills replicas costs 2 restarts before it is dropped (the budget bounds the run's restarts).

In a fleet of one replica, the second replica a poison prompt must fail on is the replacement of the first: telling
a poison prompt from a broken lone replica costs that one restart (were one raise on the lone replica enough, a broken
lone replica would drop every prompt and never be replaced).

Prompts are the caller's keys (the ledger's prompt ids); replicas are names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Set

POISON_REPLICAS = 2
"""Distinct replicas (name and generation) a prompt must fail on, the last time alone, to be poison."""
RAISED, LOST = "raised", "lost"
"""How a call failed: it raised (the replica lives), or its replica was lost (died, or hung past the watchdog)."""


class Failure(NamedTuple):
    """One failure on a prompt's record."""

    replica: str
    generation: int
    how: str
    """``RAISED`` or ``LOST``."""
    alone: bool
    """The prompt was alone in the failed call."""


@dataclass
class Verdict:
    """What to do after a call failed."""

    poison: Dict[int, str] = field(default_factory=dict)
    """Prompts found poison, with the reason: their samples are recorded failures, not issued again."""
    retry: List[int] = field(default_factory=list)
    """Prompts to issue again, each alone (after a raise, ``FailureTracker.avoid`` names the replica to keep them
    off)."""
    replace: Optional[str] = None
    """After a raise: the cause when the replica is to be replaced now (its strikes reached the limit); None: it
    keeps serving."""


class FailureTracker:
    """Failures per prompt and strikes per replica (see the module docstring)."""

    def __init__(self, max_strikes: int = 3) -> None:
        if max_strikes < 1:
            raise ValueError(f"max_strikes={max_strikes} (at least 1)")
        self.max_strikes = max_strikes
        self.generation: Dict[str, int] = {}
        self.failed: Dict[int, List[Failure]] = {}
        """Prompt -> its failures on distinct (replica, generation) that count (module docstring), oldest first."""
        self.strikes: Dict[str, List[tuple]] = {}
        """Replica -> the prompts of each call that raised on it since its last success, unexplained."""
        self.isolated: Set[int] = set()
        """Prompts to be issued alone until they are answered."""
        self.avoid: Dict[int, str] = {}
        """Prompt -> the replica it last raised on (kept off it when another replica takes work)."""

    def raised(self, replica: str, prompts: Sequence[int], error: str) -> Verdict:
        """The call of ``prompts`` on ``replica`` raised ``error`` (one line): the verdict."""
        prompts = [int(p) for p in prompts]
        if not prompts:
            raise ValueError("a call that raised held no prompt")
        out = Verdict()
        if len(prompts) == 1 and self._record(replica, prompts[0], RAISED, True):
            out.poison[prompts[0]] = self._reason(prompts[0], error)
            self._explained(prompts[0])
            return out
        self.strikes.setdefault(replica, []).append(tuple(prompts))
        for p in prompts:
            self.isolated.add(p)
            self.avoid[p] = replica
            out.retry.append(p)
        count = len(self.strikes[replica])
        if count >= self.max_strikes:
            out.replace = f"failing: {count} generate calls in a row raised, the last: {error}"[:300]
        return out

    def lost(self, replica: str, prompts: Sequence[int], cause: str) -> Verdict:
        """``replica`` was lost (``cause``: died or hung) while running the call of ``prompts`` (its other calls, not
        started, are no evidence): the verdict, before the caller books its replacement (``replaced``). No strikes:
        the replica is replaced anyway."""
        prompts = [int(p) for p in prompts]
        out = Verdict()
        for p in prompts:
            if self._record(replica, p, LOST, len(prompts) == 1):
                out.poison[p] = self._reason(p, cause)
                self._explained(p)
            else:
                self.isolated.add(p)
                out.retry.append(p)
        return out

    def answered(self, replica: str, prompts: Sequence[int]) -> None:
        """``replica`` answered the call of ``prompts``: its strikes cleared, the prompts forgotten."""
        self.strikes.pop(replica, None)
        for p in prompts:
            self.forget(int(p))

    def replaced(self, replica: str) -> None:
        """``replica`` was replaced: a new generation, no strikes."""
        self.generation[replica] = self.generation.get(replica, 0) + 1
        self.strikes.pop(replica, None)

    def forget(self, prompt: int) -> None:
        """``prompt`` needs no more bookkeeping (answered, or its round is gone)."""
        self.failed.pop(prompt, None)
        self.isolated.discard(prompt)
        self.avoid.pop(prompt, None)

    def strike_count(self, replica: str) -> int:
        return len(self.strikes.get(replica, []))

    def _record(self, replica: str, prompt: int, how: str, alone: bool) -> bool:
        """A failure of ``prompt`` on ``replica`` noted (once per replica and generation); whether it is poison now."""
        if how == RAISED and not alone:
            return False
        record = self.failed.setdefault(prompt, [])
        generation = self.generation.get(replica, 0)
        if all((f.replica, f.generation) != (replica, generation) for f in record):
            record.append(Failure(replica, generation, how, alone))
        return alone and len(record) >= POISON_REPLICAS

    def _reason(self, prompt: int, cause: str) -> str:
        """Why ``prompt`` is poison: the replicas on its record and the last cause."""
        record = self.failed[prompt]
        names = [f.replica if f.generation == 0 else f"{f.replica} (generation {f.generation})" for f in record]
        if all(f.how == RAISED for f in record):
            text = f"poison prompt: its generate call raised alone on {', '.join(names)}: {cause}"
        elif all(f.how == LOST for f in record):
            text = (f"poison prompt: replicas {', '.join(names)} were lost while it was in their calls, the last time "
                    f"alone: {cause}")
        else:
            parts = [f"{name} ({f.how}{' alone' if f.alone else ''})" for name, f in zip(names, record)]
            text = f"poison prompt: its generate calls failed on {', '.join(parts)}, the last: {cause}"
        return text[:300]

    def _explained(self, prompt: int) -> None:
        """``prompt`` is poison: the raises of calls that held it are struck off every replica; it is forgotten."""
        for replica in list(self.strikes):
            self.strikes[replica] = [call for call in self.strikes[replica] if prompt not in call]
            if not self.strikes[replica]:
                del self.strikes[replica]
        self.forget(prompt)
