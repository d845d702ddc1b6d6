#!/usr/bin/env bash
# GRPO on the generated arithmetic task: the learning-curve setting, small enough for a CPU.
# Usage: bash examples/grpo_arith.sh [key=value ...]   (extra overrides win; e.g. trainer.total_steps=2 to try it)
# No GPU: the CPU profile shrinks sizes unless given here; on a GPU machine these sizes apply as written.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m reasonrl.train task=arith algorithm=grpo \
    data.train_batch_size=8 \
    rollout.n=4 \
    rollout.max_new_tokens=64 \
    actor.lr=2e-6 \
    trainer.total_steps=40 \
    trainer.val_every=10 \
    trainer.val_before_train=true \
    data.val_limit=64 \
    rollout.engine=hf \
    trainer.output_dir=outputs/grpo_arith \
    "$@"
