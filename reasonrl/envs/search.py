"""The ``search`` environment: a full-text search over the fictional corpus of ``task=search``
(``reasonrl.datasets.search``), in SQLite's FTS5 index (Python's standard library), one in-memory index per loop.

Tool: ``search(query)`` returns the best ``TOP_K`` documents by BM25. Reward: 1.0 once a result has shown the
document that holds the row's answer (``extra_info.fact_title``), else 0.0: whether the search found the fact, to
compare with the verifier's verdict on the final answer.
"""
from __future__ import annotations

import re
import sqlite3
import threading
from typing import Any, Dict, List

from .base import EnvContext, Environment, StepResult, tool
from .registry import register_environment

TOP_K = 3
MAX_TERMS = 16
QUERY_SCHEMA = {"type": "object", "properties": {"query": {"type": "string", "description": "words to look for"}},
                "required": ["query"]}
SEARCH_TOOLS = [{"type": "function", "function": {
    "name": "search", "description": "Search the encyclopedia; returns the best matching articles.",
    "parameters": QUERY_SCHEMA}}]
"""The tools the search environment offers (its ``@tool``; a row's prompt offers them, ``reasonrl.envs.prompting``:
through the chat template's ``tools=`` where it takes them, else as ``describe_tools`` text in the system message)."""


class CorpusIndex:
    """The corpus in an in-memory FTS5 table; ``search`` is thread-safe (one connection behind a lock)."""

    def __init__(self, docs: List[Dict[str, str]]) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE VIRTUAL TABLE docs USING fts5(title, text)")
        self.db.executemany("INSERT INTO docs(title, text) VALUES (?, ?)", [(d["title"], d["text"]) for d in docs])
        self.lock = threading.Lock()

    def search(self, query: str, k: int = TOP_K) -> List[Dict[str, str]]:
        """The ``k`` best documents for the words of ``query`` (any of them; FTS5 syntax in it is not read)."""
        terms = re.findall(r"\w+", query)[:MAX_TERMS]
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', "") + '"' for t in terms)
        with self.lock:
            found = self.db.execute("SELECT title, text FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT ?",
                                    (match, k)).fetchall()
        return [{"title": title, "text": text} for title, text in found]

    def close(self) -> None:
        self.db.close()


def corpus_index(context: EnvContext) -> CorpusIndex:
    def build() -> CorpusIndex:
        from reasonrl.datasets.search import build_corpus

        return CorpusIndex(build_corpus())

    return context.shared("search_index", build)


@register_environment("search")
class SearchEnvironment(Environment):
    """``search(query)`` over the task's corpus; reward 1.0 once the answer's document was shown."""

    parser = "hermes"

    def __init__(self, context: EnvContext = None) -> None:
        super().__init__(context)
        self.index = corpus_index(self.context)
        self.found = False

    def reset(self, row: Dict[str, Any]):
        self.found = False
        return super().reset(row)

    @tool(SEARCH_TOOLS[0]["function"]["description"], QUERY_SCHEMA)
    def search(self, query: str) -> StepResult:
        hits = self.index.search(query)
        if not hits:
            return StepResult("No results.", reward=float(self.found))
        fact = (self.row.get("extra_info") or {}).get("fact_title")
        self.found = self.found or any(h["title"] == fact for h in hits)
        text = "\n".join(f"{i + 1}. {h['title']}: {h['text']}" for i, h in enumerate(hits))
        return StepResult(text, reward=float(self.found))
