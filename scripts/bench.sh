#!/usr/bin/env bash
# The benchmark command: prepares Docker (scripts/docker-setup.sh), then runs
# `dlock bench` with the given arguments (see `go run ./cmd/dlock bench -h`).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '==> %s\n' "$*" >&2; }

step "bash scripts/docker-setup.sh"
bash scripts/docker-setup.sh

step "go run ./cmd/dlock bench $*"
exec go run ./cmd/dlock bench "$@"
