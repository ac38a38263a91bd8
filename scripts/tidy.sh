#!/usr/bin/env bash
# Runs `go mod tidy` in every module of the repository (go.work's use list).
# The nested modules require the repository's other modules at the release's
# version, which no proxy serves before the release; go.work maps that
# version to the local tree, but tidy ignores go.work. So each module is tidied
# with temporary replace directives to the local tree, dropped afterwards: no
# go.mod keeps one.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mods=$(sed -n 's#^[[:space:]]*\(\.[^ ]*\)$#\1#p' go.work)
modpath() { if [ "$1" = . ]; then echo github.com/dlock/dlock; else echo "github.com/dlock/dlock/${1#./}"; fi; }
for m in $mods; do
  cd "$root/$m"
  reps=()
  for o in $mods; do
    [ "$o" = "$m" ] && continue
    p=$(modpath "$o")
    grep -q "^[[:space:]]*$p v\|^require $p v" go.mod || continue
    reps+=("$p")
    go mod edit -replace "$p=$(realpath --relative-to=. "$root/$o")"
  done
  GOWORK=off GOFLAGS=-mod=mod go mod tidy || { for p in "${reps[@]}"; do go mod edit -dropreplace "$p"; done; exit 1; }
  for p in "${reps[@]}"; do go mod edit -dropreplace "$p"; done
done
