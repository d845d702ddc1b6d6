#!/usr/bin/env bash
# Device-side driver for the GPU benchmarks (run from the repository root on the H200 machine; README.md beside this
# file gives the order of the calls).
#
#   benchmarks/gpu_run.sh part K          copy .carry/vllm/pK/* into /tmp/vp (one vLLM part per call)
#   benchmarks/gpu_run.sh setup           unpack vLLM (all parts), Ray and the wheels into /tmp/site (once)
#   benchmarks/gpu_run.sh step [ARGS]     setup, then benchmarks/gpu_grpo_step.py ARGS -> $OUT/gpu_grpo_step.json
#   benchmarks/gpu_run.sh anchors [ARGS]  setup, then benchmarks/gpu_anchors.py ARGS  -> $OUT/gpu_anchors.json
#   benchmarks/gpu_run.sh mfu [ARGS]      the wheels only (no vLLM, no Ray), then benchmarks/gpu_update_mfu.py ARGS
#                                         -> $OUT/gpu_update_mfu.json (carry .carry/whl)
#
# What travels (built on the CPU machine, kept out of git by .git/info/exclude's /.carry/):
#   .carry/vllm/p0..p4  vLLM 0.26.0 and its wheels (../shared/gpu/pack-vllm.sh), one part per call
#   .carry/ray          ray-core.tar.xz (../shared/gpu/pack-ray.sh; its extra wheels are already in the vLLM bundle)
#   .carry/whl          the project's pure-Python dependencies the image lacks (omegaconf, antlr4, math-verify, ...)
set -euo pipefail  # pipefail: a benchmark's failure is the pipeline's exit status
SITE=/tmp/site
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

setup_wheels() {
  if [ ! -f "$SITE/.whl-ok" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .carry/whl/*.whl
    touch "$SITE/.whl-ok"
  fi
  for sub in verifiers sandboxes datasets; do [ -e "reasonrl/$sub" ] || ln -s "../$sub" "reasonrl/$sub"; done
  export PYTHONPATH=$SITE:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
}

setup() {
  if [ ! -f "$SITE/.vllm-ok" ]; then
    (cd /tmp/vp && sha256sum -c --quiet SHA256SUMS)
    mkdir -p "$SITE"
    cat /tmp/vp/vllm.tar.xz.* | xz -dc | tar -x -C "$SITE"
    rm -rf /tmp/vp
    touch "$SITE/.vllm-ok"
  fi
  if [ ! -f "$SITE/.ray-ok" ]; then
    tar -C "$SITE" -xJf .carry/ray/ray-core.tar.xz
    touch "$SITE/.ray-ok"
  fi
  if [ ! -f "$SITE/.whl-ok" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .carry/whl/*.whl
    touch "$SITE/.whl-ok"
  fi
  # setup.py maps reasonrl.{verifiers,sandboxes,datasets} to top-level folders; without an install, links do it
  for sub in verifiers sandboxes datasets; do [ -e "reasonrl/$sub" ] || ln -s "../$sub" "reasonrl/$sub"; done
  export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$PWD
  export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1
  python3 -c "import vllm, ray, omegaconf, torch; print('vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
}

cmd=${1:?usage: gpu_run.sh part K | setup | step [ARGS] | anchors [ARGS] | mfu [ARGS]}
shift
case $cmd in
  part)
    mkdir -p /tmp/vp && cp ".carry/vllm/p$1/"* /tmp/vp/ && ls -la /tmp/vp && df -h /tmp | tail -1 ;;
  setup)
    setup ;;
  step)
    setup
    rc=0
    python3 benchmarks/gpu_grpo_step.py --out "$OUT/gpu_grpo_step.json" "$@" 2>&1 | tee "$OUT/gpu_grpo_step.log" \
      | grep -vE "(INFO|DEBUG) [0-9]{2}-[0-9]{2} " || rc=$?
    cp "$OUT/gpu_grpo_step.json" /tmp/gpu_grpo_step.json 2>/dev/null || true  # for the anchors call's ratio
    exit $rc ;;
  anchors)
    setup
    python3 benchmarks/gpu_anchors.py --out "$OUT/gpu_anchors.json" --step-json /tmp/gpu_grpo_step.json "$@" 2>&1 | tee "$OUT/gpu_anchors.log" \
      | grep -vE "(INFO|DEBUG) [0-9]{2}-[0-9]{2} " ;;
  mfu)
    setup_wheels
    python3 benchmarks/gpu_update_mfu.py --out "$OUT/gpu_update_mfu.json" "$@" 2>&1 | tee "$OUT/gpu_update_mfu.log" ;;
  *)
    echo "unknown command $cmd" >&2; exit 2 ;;
esac
