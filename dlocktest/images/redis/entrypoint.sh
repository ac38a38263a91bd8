#!/bin/sh
# Runs redis-server with the test settings (no persistence, no protection,
# every interface of the container: only ever publish its port on
# 127.0.0.1), the container's arguments appended as options.
#
# With "sentinel" as the first argument, runs Redis Sentinel instead, on the
# same port and with the same settings, from a fresh writable config file
# (Sentinel rewrites it), the remaining arguments appended as options.
set -e
if [ "${1:-}" = sentinel ]; then
	shift
	printf 'port 6379\nbind 0.0.0.0\nprotected-mode no\n' >/tmp/sentinel.conf
	exec redis-sentinel /tmp/sentinel.conf "$@"
fi
exec redis-server --bind 0.0.0.0 --protected-mode no --save "" --appendonly no --port 6379 "$@"
