#!/bin/sh
# Build the Lean + Mathlib + REPL image used by the lean verifier (needs network; ~5 GB; several minutes).
#   sandboxes/images/lean/build.sh [TAG]     (default tag: reasonrl-lean)
# Override versions with e.g. --build-arg LEAN_TOOLCHAIN=leanprover/lean4:v4.24.0 by editing the line below.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
exec docker build -t "${1:-reasonrl-lean}" "$here"
