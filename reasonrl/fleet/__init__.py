"""The rollout fleet's foundations (issue #47): which replica serves a request (router.py), the prompt ledger that a
crash neither loses nor duplicates (ledger.py), per-replica health with a restart budget (health.py) and the
replicas' heartbeats it reads (progress.py), and admission that bounds staleness by pacing for fully asynchronous
training (admission.py, issue #48). Pure bookkeeping with no
torch, Ray or vLLM import; ``reasonrl.trainer.fleet_source`` drives them when ``fleet.enabled`` (docs/fleet.md)."""
