#!/usr/bin/env bash
# Installs Debian packages quietly, for scripts/test.sh and docker-setup.sh:
# apt-get update, then apt-get install -y PKG..., without prompts and with
# needrestart suspended (under a non-interactive apt it prints "readline() on
# closed filehandle HENV ..." and would restart services). apt's chatter goes
# to a log ($DLOCK_APT_LOG, default $TMPDIR/dlock-apt.log), printed only when
# apt fails.
#   usage: scripts/apt-install.sh PKG...
set -euo pipefail

log=${DLOCK_APT_LOG:-${TMPDIR:-/tmp}/dlock-apt.log}
if [ "$(id -u)" -eq 0 ]; then sudo_=(); else sudo_=(sudo); fi
# env, not a prefix assignment: sudo would drop the variables.
apt() { "${sudo_[@]}" env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 NEEDRESTART_MODE=l apt-get "$@"; }

if ! { apt update -qq && apt install -y -qq -o Dpkg::Use-Pty=0 "$@"; } >"$log" 2>&1; then
  printf 'apt-get install %s failed; the end of its log (%s):\n' "$*" "$log" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
