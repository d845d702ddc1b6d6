#!/usr/bin/env bash
# Prepares this (Debian, root) machine for reasonrl's sandboxes. Idempotent: a second run only checks.
#   1. apt-get installs docker.io, bubblewrap, debootstrap, tini where missing, and chromium (the headless browser
#      tests/unit/view/test_view.py drives);
#   2. starts dockerd (--iptables=false --ip-forward=false --bridge=none) in the background unless one answers;
#   3. creates the unprivileged users (reasonrl-sbx0..15) that the bwrap backend runs untrusted code as;
#   4. builds the sandbox root filesystem with debootstrap and imports it as the docker image
#      reasonrl-sandbox:<hash of sandboxes/images recipe> (no registry), once per recipe version.
# Env: REASONRL_SANDBOX_USER (user name prefix, default reasonrl-sbx), REASONRL_SANDBOX_USERS (how many, 16), REASONRL_SANDBOX_ROOT (default /var/lib/reasonrl),
#      REASONRL_DEBIAN_MIRROR (default: the first deb.debian.org-style URI in apt's sources).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
images="$repo/sandboxes/images"
user="${REASONRL_SANDBOX_USER:-reasonrl-sbx}"
state="${REASONRL_SANDBOX_ROOT:-/var/lib/reasonrl}"
log() { echo "[setup_sandboxes] $*"; }
[ "$(id -u)" = 0 ] || { echo "setup_sandboxes.sh must run as root" >&2; exit 1; }

# 1. packages
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v debootstrap >/dev/null || need+=(debootstrap)
[ -x /usr/bin/tini ] || need+=(tini)
command -v chromium >/dev/null || need+=(chromium)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
fi

# 2. docker daemon
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd"
  mkdir -p /var/log
  nohup dockerd --iptables=false --ip-forward=false --bridge=none >>/var/log/reasonrl-dockerd.log 2>&1 &
  for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -20 /var/log/reasonrl-dockerd.log >&2; echo "dockerd did not start" >&2; exit 1; }
fi

# 3. the unprivileged sandbox users (bwrap backend): one per concurrent run, because RLIMIT_NPROC counts the
#    processes of a real uid; user namespaces must be allowed for them
for i in $(seq 0 $((${REASONRL_SANDBOX_USERS:-16} - 1))); do
  id -u "$user$i" >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin "$user$i"
done
if [ -e /proc/sys/kernel/unprivileged_userns_clone ] && [ "$(cat /proc/sys/kernel/unprivileged_userns_clone)" = 0 ]; then
  echo 1 > /proc/sys/kernel/unprivileged_userns_clone
fi

# 4. root filesystem + image, cached by the hash of the recipe (same hash as reasonrl.sandboxes.image)
hash="$(cat "$images/build_rootfs.sh" "$images/packages.txt" | sha256sum | cut -c1-12)"
tag="reasonrl-sandbox:$hash"
rootfs="$state/rootfs-$hash"
mkdir -p "$state"
if [ ! -x "$rootfs/usr/bin/python3" ]; then
  mirror="${REASONRL_DEBIAN_MIRROR:-$(grep -rhoE '(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
           | head -1 | awk '{print $2}' || true)}"
  mirror="${mirror:-http://deb.debian.org/debian}"
  log "building root filesystem $rootfs from $mirror (debootstrap, a few minutes)"
  bash "$images/build_rootfs.sh" "$rootfs.tmp" "$mirror"
  rm -rf "$rootfs"; mv "$rootfs.tmp" "$rootfs"; mv "$rootfs.tmp.log" "$rootfs.log" 2>/dev/null || true
fi
ln -sfn "$rootfs" "$state/rootfs"
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  log "importing $rootfs as docker image $tag"
  tar -C "$rootfs" -c . | docker import --change 'CMD ["/usr/bin/python3"]' --change 'WORKDIR /work' \
    -m "reasonrl sandbox, recipe $hash" - "$tag" >/dev/null
fi
docker tag "$tag" reasonrl-sandbox:latest
log "ready: bwrap $(bwrap --version | awk '{print $2}'), docker image $tag, rootfs $rootfs, users ${user}0..${user}$((${REASONRL_SANDBOX_USERS:-16} - 1))"
