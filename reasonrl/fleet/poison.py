"""A poison prompt told apart from a broken replica: pure bookkeeping of the fleet's ``generate`` calls that *raised*
(the replica's process lives and its method raised; a replica that died or hung is not this module's business).

A replica that raises may be broken (it would raise on every call) or may have been handed a prompt that makes any
replica raise (a poison prompt). Replacing the replica each time is wrong for the second: the prompt raises on every
replica, each raise costs a restart, and the run stops when the budget is spent. So a raise is answered this way:

- its prompts are *isolated*: each is issued again alone (one prompt per call) until it is answered, on another
  replica than the one that raised when another takes work;
- a prompt that raised alone on 2 distinct replicas (a replica and its replacement count as 2: a generation is
  counted per replica) is poison: it is not issued again, its samples become recorded failures with a reason that
  names the replicas and the error (dropped in the ledger when the round is trained), and every raise it explains is
  struck off the replicas' records;
- a replica is charged a *strike* for each call that raised and no poison prompt explains; a success clears its
  strikes; at ``max_strikes`` strikes in a row it is replaced (the caller books the restart, as for a death). A broken
  replica thus still ends replaced (it raises on distinct prompts, which then answer elsewhere), a healthy replica that
  met a poison prompt does not.

In a fleet of one replica, the second replica a poison prompt must raise on is the replacement of the first: telling
a poison prompt from a broken lone replica costs that one restart (were one raise on the lone replica enough, a broken
lone replica would drop every prompt and never be replaced).

Prompts are the caller's keys (the ledger's prompt ids); replicas are names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

POISON_REPLICAS = 2
"""Distinct replicas (name and generation) a prompt must raise on, alone, to be poison."""


@dataclass
class RaiseVerdict:
    """What to do after a call raised."""

    poison: Dict[int, str] = field(default_factory=dict)
    """Prompts found poison, with the reason: their samples are recorded failures, not issued again."""
    retry: List[int] = field(default_factory=list)
    """Prompts to issue again, each alone (``RaiseTracker.avoid`` names the replica to keep them off)."""
    replace: Optional[str] = None
    """The cause when the replica is to be replaced now (its strikes reached the limit); None: it keeps serving."""


class RaiseTracker:
    """Raises per prompt and strikes per replica (see the module docstring)."""

    def __init__(self, max_strikes: int = 3) -> None:
        if max_strikes < 1:
            raise ValueError(f"max_strikes={max_strikes} (at least 1)")
        self.max_strikes = max_strikes
        self.generation: Dict[str, int] = {}
        self.alone: Dict[int, List[Tuple[str, int]]] = {}
        """Prompt -> the distinct (replica, generation) it raised on while alone in a call."""
        self.strikes: Dict[str, List[Tuple[int, ...]]] = {}
        """Replica -> the prompts of each call that raised on it since its last success, unexplained."""
        self.isolated: Set[int] = set()
        """Prompts to be issued alone until they are answered."""
        self.avoid: Dict[int, str] = {}
        """Prompt -> the replica it last raised on (kept off it when another replica takes work)."""

    def raised(self, replica: str, prompts: Sequence[int], error: str) -> RaiseVerdict:
        """The call of ``prompts`` on ``replica`` raised ``error`` (one line): the verdict."""
        prompts = [int(p) for p in prompts]
        if not prompts:
            raise ValueError("a call that raised held no prompt")
        out = RaiseVerdict()
        where = (replica, self.generation.get(replica, 0))
        if len(prompts) == 1:
            p = prompts[0]
            seen = self.alone.setdefault(p, [])
            if where not in seen:
                seen.append(where)
            if len(seen) >= POISON_REPLICAS:
                names = ", ".join(name if gen == 0 else f"{name} (generation {gen})" for name, gen in seen)
                out.poison[p] = f"poison prompt: its generate call raised alone on {names}: {error}"[:300]
                self._explained(p)
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
        self.alone.pop(prompt, None)
        self.isolated.discard(prompt)
        self.avoid.pop(prompt, None)

    def _explained(self, prompt: int) -> None:
        """``prompt`` is poison: the raises of calls that held it are struck off every replica; it is forgotten."""
        for replica in list(self.strikes):
            self.strikes[replica] = [call for call in self.strikes[replica] if prompt not in call]
            if not self.strikes[replica]:
                del self.strikes[replica]
        self.forget(prompt)

    def strike_count(self, replica: str) -> int:
        return len(self.strikes.get(replica, []))
