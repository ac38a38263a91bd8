#!/usr/bin/env bash
# The benchmark command: prepares Docker (scripts/docker-setup.sh), then runs
# `dlock bench` with the given arguments (see `go run ./cmd/dlock bench -h`).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '==> %s\n' "$*" >&2; }

step "bash scripts/docker-setup.sh"
bash scripts/docker-setup.sh

# The default run compares every backend: build their server images side by
# side first (on a fresh machine each installs its server from Debian's
# mirror) rather than one after another as the bench reaches them.
if [ $# -eq 0 ]; then
  step "go run ./dlocktest/cmd/buildimages redis etcd zookeeper postgres mariadb"
  go run ./dlocktest/cmd/buildimages redis etcd zookeeper postgres mariadb
fi

step "go run ./cmd/dlock bench $*"
exec go run ./cmd/dlock bench "$@"
