#!/bin/sh
# Runs the leanprover-community REPL with the Mathlib project's search path (computed at image build time).
LEAN_PATH="$(cat /home/lean/lean_path)"
export LEAN_PATH
cd /home/lean/project || exit 1
exec /home/lean/repl/.lake/build/bin/repl "$@"
