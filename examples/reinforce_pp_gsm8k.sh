#!/usr/bin/env bash
# REINFORCE++ on GSM8K: batch-whitened discounted returns, KL penalty in the reward.
# Usage: bash examples/reinforce_pp_gsm8k.sh [key=value ...]   (extra overrides win; e.g. trainer.total_steps=2 to try it)
# No GPU: the CPU profile shrinks sizes unless given here; on a GPU machine these sizes apply as written.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m reasonrl.train task=gsm8k algorithm=reinforce_pp \
    data.train_batch_size=32 \
    rollout.n=8 \
    rollout.max_new_tokens=512 \
    actor.lr=1e-6 \
    actor.ppo_mini_batch_size=16 \
    trainer.total_steps=200 \
    trainer.val_every=20 \
    trainer.save_every=20 \
    trainer.output_dir=outputs/reinforce_pp_gsm8k \
    "$@"
