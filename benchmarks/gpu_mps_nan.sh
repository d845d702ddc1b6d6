#!/bin/bash
# Issue #48 (thirty-second session): the s31_sm_share series' line with the trainer capped at 60% of the SMs under MPS
# (async_rollout.actor_sm_percent=60) halted after its first 3 updates, every gradient norm non-finite; the same line
# without the cap trained its 9 steps on the same H100 (benchmarks/results/s32_sm_share_*). Is it the cap itself? The
# real actor update (benchmarks/gpu_update_mfu.py: the 1.5B shape, random weights, bf16, the GPU's default path; no
# replicas beside it) three ways: with no MPS, as a client of an MPS daemon, and as a client with
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60. Each writes $OUT/mps_nan_<label>.json (and .log); the last lines print each
# way's gradient norm, policy loss and old log-prob mean. About 4 minutes on a GPU (an estimate: three updates' starts).
# The thirty-third session's lease answered yes: at 60% the update alone had a NaN gradient norm and loss, with no MPS
# and under MPS with no limit it was finite (benchmarks/results/s33_mps_nan_*.json).
#   bash benchmarks/gpu_run.sh mpsnan [gpu_update_mfu.py ARGS]   (the wheels only, as `mfu`: carry .carry/whl)
# LOCATE=1: which operation? benchmarks/gpu_cap_locate.py instead, three ways, all as MPS clients: no limit (the
# control), 60%, and 60% with cuBLASLt as torch's preferred BLAS library -> $OUT/cap_locate_<label>.json (and .log).
# The thirty-fourth session's lease ran the first two and a third with padded sdpa rows (91 s for all three): every
# op alone was finite under the cap, the grad pass was not (benchmarks/results/s34_cap_locate_*.json); this round
# adds each linear's three GEMMs repeated, the parameters whose gradient is not finite, and the BLAS library. About
# 3 minutes (an estimate).
#   LOCATE=1 bash benchmarks/gpu_run.sh mpsnan [gpu_cap_locate.py ARGS]
# CPU dry runs: MPS=true NO_SETUP=1 OUT=/tmp/mpsnan bash benchmarks/gpu_run.sh mpsnan --shape tiny (and LOCATE=1)
set -uo pipefail
OUT=${OUT:-/tmp/out}
MPS=${MPS:-nvidia-cuda-mps-control}  # `true` on a CPU: no daemon, the three ways then differ in name only
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mpsnan/p CUDA_MPS_LOG_DIRECTORY=/tmp/mpsnan/l
mkdir -p "$OUT" $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
# The series' micro-batches: by a budget of 8192 tokens, as its lines ran (actor.max_tokens_per_micro_batch).
ARGS=(--variants fused --micro-batches 8 --warmup 1 --steps 2 --profile false --deadline-s 400
      --set actor.max_tokens_per_micro_batch=8192 "$@")
update() {  # update LABEL [ENV...]: one gpu_update_mfu.py run in its own process
  local label=$1
  shift
  echo "== $label"
  env "$@" python3 benchmarks/gpu_update_mfu.py --out "$OUT/mps_nan_$label.json" "${ARGS[@]}" \
    > "$OUT/mps_nan_$label.log" 2>&1
  echo "$label rc $?"
}
locate() {  # locate LABEL [ENV...] -- [ARGS...]: one gpu_cap_locate.py run in its own process
  local label=$1 envs=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  echo "== $label"
  env "${envs[@]}" python3 benchmarks/gpu_cap_locate.py --out "$OUT/cap_locate_$label.json" "$@" \
    > "$OUT/cap_locate_$label.log" 2>&1
  echo "$label rc $?"
  grep -E '^(ops|gemms|passes) ' "$OUT/cap_locate_$label.log" | cut -c1-400
}
if [ "${LOCATE:-0}" = 1 ]; then
  $MPS -d
  locate mps A=1 -- "$@"
  locate mps_sm60 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 -- "$@"
  locate mps_sm60_cublaslt CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 -- --blas cublaslt "$@"
  echo quit | $MPS
  exit 0
fi
update no_mps
$MPS -d
update mps A=1
update mps_sm60 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60
echo quit | $MPS
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
for label in ("no_mps", "mps", "mps_sm60"):
    path = Path(sys.argv[1]) / f"mps_nan_{label}.json"
    result = json.loads(path.read_text()) if path.exists() else {"status": "no JSON"}
    for name, variant in result.get("variants", {}).items():
        m = variant.get("actor_metrics", {})
        print(label, name, "grad_norm", m.get("actor/grad_norm"), "pg_loss", m.get("actor/pg_loss"),
              "old_log_probs_mean", variant.get("old_log_probs_mean"), flush=True)
    print(label, "status", result.get("status"), str(result.get("error", ""))[-300:], flush=True)
PY
