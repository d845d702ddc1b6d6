#!/usr/bin/env bash
# GRPO on the generated arithmetic task, 40 steps of 8 prompts x 4 at lr 2e-6 with the KL term: a cautious setting
# that learns slowly (on a 2-core CPU: 7 steps in 20 minutes, training reward about 0.05, held-out 0.250 -> 0.281).
# The learning curves (benchmarks/README.md) use T=0.7, lr 1e-5 and 4 mini-batches, no KL; to see learning on a CPU
# in minutes: python -m reasonrl.train task=arith trainer.profile=laptop (README.md, Train).
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
