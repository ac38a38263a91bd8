#!/usr/bin/env bash
# Proves the repository installs as a user meets a release: serves the
# committed tree (HEAD, or $1) from a file-based module proxy at a test
# version, then, with an empty module cache and no go.work:
#   1. go install github.com/dlock/dlock/cmd/dlock@VERSION works;
#   2. a scratch application importing dlock, dlock/redis and dlock/otel
#      builds, and its module graph stays small (≤ 50 lines of
#      `go mod graph`) and names no Docker module.
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

step "a scratch application importing dlock, dlock/redis and dlock/otel"
app="$work/app"
mkdir -p "$app"
cat >"$app/main.go" <<'GO'
package main

import (
	"context"
	"fmt"

	"github.com/dlock/dlock"
	dlockotel "github.com/dlock/dlock/otel"
	_ "github.com/dlock/dlock/redis"
)

func main() {
	hook, err := dlockotel.Hook(nil)
	if err != nil {
		panic(err)
	}
	l, err := dlock.Open(context.Background(), "redis://127.0.0.1:6379/0")
	fmt.Println(l != nil, err, hook != nil)
}
GO
(
  cd "$app"
  go mod init example.com/app >/dev/null 2>&1
  go get "github.com/dlock/dlock@$version" "github.com/dlock/dlock/otel@$version" >/dev/null
  go mod tidy
  go build -trimpath -o /dev/null .
  lines=$(go mod graph | wc -l)
  echo "go mod graph: $lines lines, modules:"
  go list -m all | sed 's/^/  /'
  [ "$lines" -le "$max_graph" ] || fail "the application's module graph has $lines lines, more than $max_graph"
  if go mod graph | grep -i docker; then fail "the application's module graph names a Docker module"; fi
)
echo "release-check: ok ($version of $(git rev-parse --short "$rev"))"
