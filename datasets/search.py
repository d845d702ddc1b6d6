"""A generated task: questions about a fictional world that only a search of its corpus answers (``task=search``,
the ``search`` environment, docs/environments.md). Deterministic: the corpus depends only on ``CORPUS_SEED``, the
rows only on the split.

The world: ``CITIES`` cities (each founded in a year) and ``PEOPLE`` people (each born in a year, in one of the
cities). One document per entity. Questions are one-hop ("In what year was the city of Valdmere founded?", "In what
year was Orin Castell born?") or two-hop ("In what year was the birthplace of Orin Castell founded?": find the
person, then the city). Answers are years, in ``\\boxed{}``, scored by the math verifier; the names are made up, so
the answer is unknowable without the tool. Train and test ask about disjoint people and cities.
"""
from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Tuple

GENERATED = True  # no upstream source: the lookup builds it directly
CORPUS_SEED = 29
CITIES, PEOPLE = 200, 1200
SIZES = {"train": 800, "test": 200}  # of 1,300 distinct questions per half of the world
SEEDS = {"train": 2901, "test": 2902}
OCCUPATIONS = ("weaver", "astronomer", "cartographer", "brewer", "violinist", "shipwright", "botanist", "glassblower")
SYLLABLES = ("val", "dor", "mir", "kes", "tha", "lun", "bra", "ve", "qua", "sil", "orn", "fen", "ga", "rho", "zel",
             "ist", "mar", "cal", "dun", "pe", "wy", "nox", "tav", "el")
SYSTEM = ("Answer the question using the search tool: the facts are in a private encyclopedia that you cannot know "
          "otherwise. Search as often as you need, then put the final answer (a year) within \\boxed{}.")


def _name(rng: random.Random, parts: int, taken: set) -> str:
    while True:
        name = "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()
        if name not in taken:
            taken.add(name)
            return name


@lru_cache(maxsize=1)
def build_world() -> Tuple[Tuple[Dict, ...], Tuple[Dict, ...]]:
    """(cities, people): ``{"name", "founded"}`` and ``{"name", "born", "city", "occupation"}``."""
    rng, taken = random.Random(CORPUS_SEED), set()
    cities = tuple({"name": _name(rng, 3, taken), "founded": rng.randint(1100, 1900)} for _ in range(CITIES))
    people = []
    for _ in range(PEOPLE):
        first, last = _name(rng, 2, set()), _name(rng, 3, taken)  # surnames unique: so are the people
        people.append({"name": f"{first} {last}", "born": rng.randint(1700, 2000),
                       "city": rng.choice(cities)["name"], "occupation": rng.choice(OCCUPATIONS)})
    return cities, tuple(people)


def build_corpus() -> List[Dict[str, str]]:
    """One document per entity: ``{"title", "text"}``."""
    cities, people = build_world()
    docs = [{"title": c["name"], "text": f"{c['name']} is a city. It was founded in the year {c['founded']}."}
            for c in cities]
    docs += [{"title": p["name"], "text": f"{p['name']} is a {p['occupation']}, born in the year {p['born']} in the "
                                          f"city of {p['city']}."} for p in people]
    return docs


def _question(rng: random.Random, test: bool) -> Tuple[str, str, int, str]:
    """(question, answer, hops, title of the document that holds the answer) about the split's half of the world (even / odd entity positions)."""
    cities, people = build_world()
    city_of = {c["name"]: c for c in cities}
    kind = rng.choice(("city", "person", "two_hop", "two_hop"))
    if kind == "city":
        c = rng.choice(cities[int(test)::2])
        return f"In what year was the city of {c['name']} founded?", str(c["founded"]), 1, c["name"]
    p = rng.choice(people[int(test)::2])
    if kind == "person":
        return f"In what year was {p['name']} born?", str(p["born"]), 1, p["name"]
    return (f"In what year was the city where {p['name']} was born founded?", str(city_of[p["city"]]["founded"]), 2,
            p["city"])


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    if split not in SIZES:
        raise ValueError(f"search has splits {sorted(SIZES)}, not {split!r}")
    system = SYSTEM  # the search tool is offered where the prompt is rendered (reasonrl/envs/prompting.py)
    rng = random.Random(SEEDS[split])
    rows, seen = [], set()
    while len(rows) < SIZES[split]:
        question, answer, hops, title = _question(rng, test=split == "test")
        if question in seen:
            continue
        seen.add(question)
        rows.append({
            "data_source": "search",
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "ability": "search",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": len(rows), "hops": hops, "fact_title": title},
            "verifier": "math",
            "environment": "search",
        })
    return rows
