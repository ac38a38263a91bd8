#!/usr/bin/env bash
# Proves the repository installs as a user meets a release: serves the
# committed tree (HEAD, or $1) from a file-based module proxy at a test
# version, then, with an empty module cache and no go.work:
#   1. go install github.com/dlock/dlock/cmd/dlock@VERSION works;
#   2. scratch applications importing dlock and dlock/redis (and, in a
#      second one, dlock/otel) build; the first's module graph stays small
#      (≤ 50 lines of `go mod graph`), and neither names a Docker module, a
#      peer lock library or the OpenTelemetry SDK.
# CI runs it from scripts/test.sh. Needs the Go module proxy for the
# third-party modules.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
version=v1.0.0-rc.0
max_graph=50

step() { printf '==> %s\n' "$*" >&2; }
fail() { printf 'release-check: %s\n' "$*" >&2; exit 1; }

work=$(mktemp -d /tmp/dlock-release.XXXXXX)
[ -n "${DLOCK_RELEASE_KEEP:-}" ] || trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

step "modproxy: the modules of $rev at $version"
go run ./tests/internal/modproxy -version "$version" -rev "$rev" -o "$work/proxy"

# Third-party modules come from this machine's module cache when it has them
# (its download cache is a file proxy), else from the usual proxy.
upstream="file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)"
export GOWORK=off GOFLAGS= GOMODCACHE="$work/modcache" GOPATH="$work/gopath" GOBIN="$work/bin"
export GOPROXY="file://$work/proxy,$upstream"
export GONOSUMDB=github.com/dlock/dlock GONOSUMCHECK=1 GOFLAGS=-mod=mod

step "go install github.com/dlock/dlock/cmd/dlock@$version (empty module cache)"
go install -trimpath "github.com/dlock/dlock/cmd/dlock@$version"
"$GOBIN/dlock" -h >/dev/null 2>&1 || [ -x "$GOBIN/dlock" ] || fail "dlock was not installed"
echo "installed: $("$GOBIN/dlock" version 2>/dev/null || echo "$GOBIN/dlock")"

# app NAME MAX_LINES IMPORTS...: builds a scratch application importing the
# given packages and checks its module graph: at most MAX_LINES lines of
# `go mod graph` (0: no bound), and no Docker, test-harness or OpenTelemetry
# SDK module.
app() {
  local name=$1 max=$2
  shift 2
  step "a scratch application importing $*"
  local dir="$work/$name"
  mkdir -p "$dir"
  {
    printf 'package main\n\nimport (\n'
    for p in "$@"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n\nfunc main() {}\n'
  } >"$dir/main.go"
  (
    cd "$dir"
    go mod init "example.com/$name" >/dev/null 2>&1
    go mod tidy
    go build -trimpath -o /dev/null .
    local lines
    lines=$(go mod graph | wc -l)
    echo "$name: go mod graph: $lines lines; by the module that requires:"
    go mod graph | awk '{print $1}' | sort | uniq -c | sort -rn | sed 's/^/  /'
    [ "$max" -eq 0 ] || [ "$lines" -le "$max" ] || fail "$name: the module graph has $lines lines, more than $max"
    if go mod graph | grep -Ei 'docker|dockertest|go.opentelemetry.io/otel/sdk|redsync|redislock'; then
      fail "$name: the module graph names a module an application should not inherit (above)"
    fi
  )
}

# The reviewer's baseline (dlock and one driver) is bounded; with the
# OpenTelemetry adapter the graph also holds OpenTelemetry's own go.mod
# requirements, which are not ours to trim: it is printed and checked for
# what it must not hold.
app app-redis "$max_graph" github.com/dlock/dlock github.com/dlock/dlock/redis
app app-redis-otel 0 github.com/dlock/dlock github.com/dlock/dlock/redis github.com/dlock/dlock/otel
# The third-party-style driver in a module of its own: its server tests'
# harness (the module mysql/tests) must not reach its users.
app app-mysql "$max_graph" github.com/dlock/dlock github.com/dlock/dlock/mysql
echo "release-check: ok ($version of $(git rev-parse --short "$rev"))"
