#!/usr/bin/env bash
# The test command: prepares Docker (scripts/docker-setup.sh), checks gofmt and
# go vet, then runs every test of every module in go.work (the library, the
# tests module, cmd/dlock, examples, otel, mysql) with the race detector
# against real servers.
# DLOCK_REQUIRE_BACKENDS defaults to 1 here, so a test that cannot get its server
# fails instead of skipping. Extra arguments go to `go test`, e.g.
#   scripts/test.sh -run Conformance -v
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '==> %s  [%s]\n' "$*" "$(date +%T)" >&2; }

# -trimpath keeps the checkout's directory out of the build cache's keys: a
# fresh clone elsewhere (CI's) reuses what an earlier run compiled and
# vetted instead of redoing all of it (go vet of one small package in a
# second clone: 1.5s with it, 4.9s without).
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"

step "bash scripts/docker-setup.sh"
bash scripts/docker-setup.sh

# The operators' tools the interoperability tests run: psql (postgres) and
# etcdctl (etcd), from Debian; and the headless browser that renders
# `dlock bench -html`'s page in a test (chromium).
missing=()
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  step "apt-get install ${missing[*]}"
  bash scripts/apt-install.sh "${missing[@]}"
fi

# The server images (one per backend, each installing its server from
# Debian's mirror) build side by side in the background while the checks
# below compile; the tests wait for them. On a machine that has them this
# is one inspect per image.
images_log=$(mktemp)
trap 'rm -f "$images_log"' EXIT
step "go run ./dlocktest/cmd/buildimages (in the background)"
go run ./dlocktest/cmd/buildimages >"$images_log" 2>&1 &
images_pid=$!

step "gofmt -l ."
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  printf 'gofmt: these files are not formatted (run gofmt -w):\n%s\n' "$unformatted" >&2
  exit 1
fi

# Every module of the workspace (go.work): the pattern spans them all.
all=github.com/dlock/dlock/...

step "go vet $all"
go vet "$all"

# staticcheck (a tool of the tests module, so the library's go.mod does not
# carry it) on every package but internal/zk, a copy of go-zookeeper kept as
# close to upstream as possible.
step "go tool staticcheck (all but internal/zk)"
go tool staticcheck $(go list "$all" | grep -v '^github.com/dlock/dlock/internal/zk$')

# go.mod's go line is the oldest Go the module supports: CI proves it by
# building and vetting (tests included) with that toolchain. The go command
# fetches it from the module proxy once (~5s) and caches it; the first run
# also compiles std and the dependencies with it (~3 min on 2 cores), later
# runs take ~3s. A newcomer's run skips it (CI=true turns it on) so that a
# fresh machine's first run does not grow by those minutes.
# It covers what applications build: the library module, otel and the
# mysql driver and its queue (the tooling modules would add minutes of compiling Docker's
# client for it).
if [ "${CI:-}" = true ] || [ "${DLOCK_CHECK_MIN_GO:-}" = 1 ]; then
  min_go="go$(sed -n 's/^go //p' go.mod)"
  lib=(./... github.com/dlock/dlock/otel/... github.com/dlock/dlock/mysql/...)
  step "GOTOOLCHAIN=$min_go go build ${lib[*]} && go vet ${lib[*]}"
  GOTOOLCHAIN="$min_go" go build "${lib[@]}"
  GOTOOLCHAIN="$min_go" go vet "${lib[@]}"
fi

# The dlock binary must not link package testing (its flags, its runtime
# hooks): dlocktest, which its bench command imports, takes a TB interface of
# its own instead.
step "go list -deps ./cmd/dlock: no package testing"
if go list -deps ./cmd/dlock | grep -qx testing; then
  echo "cmd/dlock links package testing; find the importer with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/dlock | grep -w testing" >&2
  exit 1
fi

# The release as a user meets it: every module served at a test version from
# a file-based proxy, installed and imported with an empty module cache
# (scripts/release-check.sh). Like the oldest-Go check it runs in CI
# (CI=true) or on request, so a newcomer's first run does not grow by it.
if [ "${CI:-}" = true ] || [ "${DLOCK_RELEASE_CHECK:-}" = 1 ]; then
  step "bash scripts/release-check.sh"
  bash scripts/release-check.sh
fi

step "waiting for the server images"
if ! wait "$images_pid"; then
  cat "$images_log" >&2
  exit 1
fi
cat "$images_log" >&2

export DLOCK_REQUIRE_BACKENDS="${DLOCK_REQUIRE_BACKENDS:-1}"
# The longest packages first (seconds beside two busy loops: tests/postgres
# 370, tests/redlock 365, tests/etcd 257, tests/redis 229, tests/zookeeper
# 177, tests/pgqueue 153, cmd/dlock 88): go test runs packages in the order
# given, two at a time on two cores, and the run ends with its longer lane.
# In import-path order the longest ones started last (~70s more).
first=(tests/postgres tests/redlock tests/etcd tests/redis tests/zookeeper tests/pgqueue cmd/dlock dlocktest mysql/tests)
first=("${first[@]/#/github.com/dlock/dlock/}")
mapfile -t rest < <(go list "$all" | grep -vxF -f <(printf '%s\n' "${first[@]}"))
step "DLOCK_REQUIRE_BACKENDS=$DLOCK_REQUIRE_BACKENDS go test -race -count=1 -timeout 20m $all (longest first) $*"
go test -race -count=1 -timeout 20m "${first[@]}" "${rest[@]}" "$@"
