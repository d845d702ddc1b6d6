#!/usr/bin/env bash
# Builds the sandbox root filesystem with debootstrap (no container registry involved) into $1.
# The result is a minimal Debian bookworm with python3 and nothing else worth mentioning. The docker
# backend imports it as an image (`docker import`); the bwrap backend can use the same tree as its root.
# Usage: build_rootfs.sh TARGET_DIR [MIRROR]
set -euo pipefail
target="$1"
mirror="${2:-http://deb.debian.org/debian}"
here="$(cd "$(dirname "$0")" && pwd)"
include="$(grep -v '^#' "$here/packages.txt" | tr -s ' \n' ',' | sed 's/^,//;s/,$//')"
rm -rf "$target"
mkdir -p "$target"
debootstrap --variant=minbase --include="$include" bookworm "$target" "$mirror" >"$target.log" 2>&1 \
  || { tail -30 "$target.log" >&2; exit 1; }
# Trim what a sandboxed interpreter never needs.
rm -rf "$target"/var/cache/apt/* "$target"/var/lib/apt/lists/* "$target"/usr/share/doc/* \
       "$target"/usr/share/man/* "$target"/usr/share/info/* "$target"/usr/share/locale/* \
       "$target"/var/log/* "$target"/root/.??* 2>/dev/null || true
# A writable work dir is mounted here at run time (tmpfs); the root itself stays read-only.
mkdir -p "$target/work"
chmod 1777 "$target/work"
# Pre-compile the standard library so that a read-only root costs no start-up time.
chroot "$target" /bin/sh -c 'python3 -m compileall -q /usr/lib/python3*' >/dev/null 2>&1 || true
