#!/usr/bin/env bash
# PPO with a critic on the arithmetic task (CPU-sized); the critic warms up for 2 steps.
# Usage: bash examples/ppo_arith.sh [key=value ...]   (extra overrides win; e.g. trainer.total_steps=2 to try it)
# No GPU: the CPU profile shrinks sizes unless given here; on a GPU machine these sizes apply as written.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m reasonrl.train task=arith algorithm=ppo \
    data.train_batch_size=8 \
    rollout.n=4 \
    rollout.max_new_tokens=64 \
    actor.lr=2e-6 \
    trainer.total_steps=40 \
    trainer.val_every=10 \
    trainer.val_before_train=true \
    data.val_limit=64 \
    rollout.engine=hf \
    critic.lr=1e-5 \
    critic.warmup_steps=2 \
    trainer.output_dir=outputs/ppo_arith \
    "$@"
