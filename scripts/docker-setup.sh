#!/usr/bin/env bash
# Prepares Docker on this machine for dlock's tests and bench, idempotently:
#   1. installs docker.io (and debootstrap) from Debian when no engine is present,
#   2. starts dockerd in the background when it is not running, and waits for it,
#   3. makes sure the base image debian:bookworm-slim exists: pulled when a registry
#      answers, otherwise built locally with debootstrap + docker import.
# Safe to run again; it does nothing when everything is in place.
set -euo pipefail

log() { printf 'docker-setup: %s\n' "$*" >&2; }
sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

BASE_IMAGE=debian:bookworm-slim

if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null 2>&1; then
    log "installing docker.io from Debian"
    bash "$(dirname "$0")/apt-install.sh" docker.io
  fi
  if ! docker info >/dev/null 2>&1; then
    log "starting dockerd"
    sudo_ bash -c 'nohup dockerd >/var/log/dlock-dockerd.log 2>&1 &'
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      sleep 1
    done
    docker info >/dev/null 2>&1 || { log "dockerd did not come up; see /var/log/dlock-dockerd.log"; exit 1; }
  fi
fi
log "docker engine is up"

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  if timeout 20 docker pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    log "pulled $BASE_IMAGE"
  else
    log "no registry reachable: building $BASE_IMAGE with debootstrap"
    if ! command -v debootstrap >/dev/null 2>&1; then
      bash "$(dirname "$0")/apt-install.sh" debootstrap
    fi
    dir=$(mktemp -d /tmp/dlock-rootfs.XXXXXX)
    trap 'sudo_ rm -rf "$dir"' EXIT
    sudo_ debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian >/dev/null
    sudo_ tar -C "$dir" -c . | docker import - "$BASE_IMAGE" >/dev/null
    log "imported $BASE_IMAGE"
  fi
fi
log "base image $BASE_IMAGE is present"
