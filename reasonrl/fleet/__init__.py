"""The rollout fleet's foundations (issue #47): which replica serves a request (router.py), the prompt ledger that a
crash neither loses nor duplicates (ledger.py), and per-replica health with a restart budget (health.py). Pure
bookkeeping with no torch, Ray or vLLM import; not yet the training loop's path (docs/architecture.md)."""
