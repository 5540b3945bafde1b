#!/usr/bin/env bash
# deploy/walk.sh - the main job: start the daemon on its embedded default
# (state in /var/lib/runrecordd, its own containerd), import the state-oracle
# unit, and walk one run through run -> park -> resume -> park -> verify -> close,
# printing what a user sees: the resume lazy and served, the second park
# storing only what changed (it fails otherwise, unless the daemon turned
# the fast path off and says why). `make run` calls it after setup and build.
#
# Usage: deploy/walk.sh [BIN_DIR]   (default: bin)
set -Eeuo pipefail

bin=${1:-bin}
rr=$bin/runrecordd
state=${RUNRECORDD_STATE_DIR:-/var/lib/runrecordd}
export RUNRECORDD_SOCKET=$state/runrecordd.sock
log=$(mktemp /tmp/runrecordd-walk.XXXXXX.log)

step() { printf '\n== %s\n' "$*"; }

daemon=
cleanup() {
	if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
		kill -TERM "$daemon"
		wait "$daemon" || true
	fi
}
trap cleanup EXIT

step "runrecordd serve --state-dir $state (embedded containerd; log: $log)"
"$rr" serve --state-dir "$state" >"$log" 2>&1 &
daemon=$!
for _ in $(seq 1 300); do
	[ -S "$RUNRECORDD_SOCKET" ] && "$rr" host >/dev/null 2>&1 && break
	kill -0 "$daemon" 2>/dev/null || { cat "$log"; echo "walk: the daemon exited" >&2; exit 1; }
	sleep 0.1
done
"$rr" host

step "images import $bin/units/oracle.tar"
"$rr" images import "$bin/units/oracle.tar" --name runrecordd.local/oracle:1

run=walk-$(date +%Y%m%d-%H%M%S)
# last_line: the oracle's last line, as `logs` reads it back.
last_line() { "$rr" logs --tail 1 "$run" 2>/dev/null; }
# waitfor N: wait until the oracle has printed a line with counter >= N.
last_counter() { last_line | sed -n 's/.*"counter":\([0-9]*\).*/\1/p'; }
waitfor() {
	for _ in $(seq 1 200); do
		c=$(last_counter)
		[ -n "$c" ] && [ "$c" -ge "$1" ] && return 0
		sleep 0.1
	done
	echo "walk: the oracle did not reach counter $1" >&2
	return 1
}

step "run --id $run --network loopback runrecordd.local/oracle:1 (64 MiB of state, a counter, an open file, a pipe to a child, a TCP server and a connection to it)"
"$rr" run --id "$run" --network loopback --env SIZE_MB=64 --env TCP_PORT=7777 runrecordd.local/oracle:1
waitfor 15
before=$(last_line)
echo "oracle before park: $before" | cut -c1-160

step "park $run"
"$rr" park "$run"

step "show $run"
"$rr" show "$run"
sleep 2

# host_off FLAG: why the daemon turned a fast path off ("" when on).
host_off() { "$rr" host | sed -n "s/^[[:space:]]*off: $1: //p"; }
# json_field NAME JSON: a number or boolean field of -o json's output.
json_field() { sed -n "s/.*\"$1\": \([0-9a-z]*\).*/\1/p" <<<"$2" | head -1; }

step "resume $run (lazily, the default: it runs before its memory is back; the page server verifies each chunk it serves)"
resumed=$("$rr" resume -o json "$run")
lazy=$(json_field lazy "$resumed") served=$(json_field served "$resumed")
echo "restore.lazy=${lazy:-false} restore.served=${served:-false}: running after $(($(json_field total_ns "$resumed") / 1000000)) ms, $(json_field pages_restored "$resumed") pages restored before it ran"
lazy_off=$(host_off --lazy-resume) served_off=$(host_off --lazy-served)
if [ -n "$lazy_off" ] || [ -n "$served_off" ]; then
	echo "the daemon turned a fast path off: ${lazy_off:+--lazy-resume: $lazy_off }${served_off:+--lazy-served: $served_off}"
fi
if { [ -z "$lazy_off" ] && [ "$lazy" != true ]; } || { [ -z "$served_off" ] && [ -z "$lazy_off" ] && [ "$served" != true ]; }; then
	echo "walk: the resume was not lazy and served, and the daemon turned neither off: $resumed" >&2
	exit 1
fi
after_start=$(last_counter)
waitfor $((after_start + 5))
after=$(last_line)
echo "oracle after resume: $after" | cut -c1-160
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" <<<"$2"; }
for f in checksum pid child_pid start_time tcp_held_port; do
	if [ "$(field "$f" "$before")" != "$(field "$f" "$after")" ]; then
		echo "walk: the oracle's $f changed across the park: not the same process" >&2
		exit 1
	fi
done
if [ "$(field counter "$after")" -le "$(field counter "$before")" ]; then
	echo "walk: the oracle's counter did not go on from where it was" >&2
	exit 1
fi
# Every tick makes one round trip on the connection held open across the
# park and one fresh connection to the unit's server (the one a park
# catches in its handshake may fail; no other may).
fails_before=$(field tcp_fresh_fail "$before") fails_after=$(field tcp_fresh_fail "$after")
if [ "$(field tcp_held "$after")" != "$(field counter "$after")" ] ||
	[ $((${fails_after:-0} - ${fails_before:-0})) -gt 1 ]; then
	echo "walk: the unit's TCP state did not survive the park: $after" >&2
	exit 1
fi
echo "same checksum, pids and start time; counter $(field counter "$before") -> $(field counter "$after"): the unit went on where it was"
echo "its TCP connection (port $(field tcp_held_port "$after")) carried $(field tcp_held "$after") round trips, its server took $(field tcp_fresh_ok "$after") fresh connections"

# store_bytes: the bytes of the store's object files (staging excluded).
store_bytes() {
	find "$state/store/objects" -path "$state/store/objects/tmp" -prune -o -type f -printf '%s\n' | awk '{n += $1} END {print n + 0}'
}
step "park $run again (it waits for every page; the store takes only the 16 KiB chunks that changed)"
before_bytes=$(store_bytes)
parked=$("$rr" park -o json "$run")
added=$(($(store_bytes) - before_bytes)) image=$(json_field image_bytes "$parked")
echo "image $image bytes; the store took $added new bytes ($((added * 1000 / image / 10)).$((added * 1000 / image % 10))% of it)"
# The oracle changes a few pages a tick; its 64 MiB buffer stays as it was.
if [ $((added * 10)) -gt "$image" ]; then
	echo "walk: the second park stored more than 10% of its image: not only what changed" >&2
	exit 1
fi

step "logs --label --tail 10 $run (the unit's output across the park, each line labelled with its interval)"
"$rr" logs --label --tail 10 "$run" | cut -c1-60

step "verify $run"
"$rr" verify "$run"

step "close $run"
"$rr" close "$run" --reason "walk finished"
"$rr" show "$run"

step "stopping the daemon"
cleanup
daemon=
echo "walk: done"
