#!/usr/bin/env bash
# PPO with a critic on GSM8K: GAE (gamma=1, lambda=1) on a value model, KL penalty in the reward.
# Usage: bash examples/ppo_gsm8k.sh [key=value ...]   (extra overrides win; e.g. trainer.total_steps=2 to try it)
# No GPU: the CPU profile shrinks sizes unless given here; on a GPU machine these sizes apply as written.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m reasonrl.train task=gsm8k algorithm=ppo \
    data.train_batch_size=32 \
    rollout.n=8 \
    rollout.max_new_tokens=512 \
    actor.lr=1e-6 \
    actor.ppo_mini_batch_size=16 \
    trainer.total_steps=200 \
    trainer.val_every=20 \
    trainer.save_every=20 \
    critic.lr=1e-5 \
    critic.cliprange_value=0.5 \
    critic.warmup_steps=0 \
    trainer.output_dir=outputs/ppo_gsm8k \
    "$@"
