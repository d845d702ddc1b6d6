"""The benchmarks' library, tested with the package: model shapes (shapes.py), result files (records.py), the step
benchmark's probes on the actor worker (probes.py), its per-step summary (summary.py) and workload (workload.py),
response-length distributions (lengths.py), a vLLM engine's facts (engine_facts.py), the actor worker alone for the
update benchmarks (update_worker.py) and the TRL anchor's GPU-free parts (trl_anchor.py). The scripts that run them
stay thin in ``benchmarks/`` (docs/architecture.md)."""
