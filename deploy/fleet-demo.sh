#!/usr/bin/env bash
# deploy/fleet-demo.sh - a fleet on this machine, for a person to watch: a
# real 3-member etcd cluster (cmd/fleetdemo) and three runrecordd hosts on
# loopback, each with its own state directory and embedded containerd. The
# first host runs the state oracle and two transcript units; then it is
# drained, and every run moves to the other two. Everything it starts is
# stopped at the end (or on failure), and its directories are removed.
#
# Usage: deploy/fleet-demo.sh [BIN_DIR]   (default: bin; run `make build` first, as root)
set -Eeuo pipefail

bin=${1:-bin}
rr=$(realpath "$bin/runrecordd")
work=$(mktemp -d /tmp/rrfleet-XXXXXX)
hosts=(h1 h2 h3)
declare -A pid key sock
etcd=

step() { printf '\n== %s\n' "$*"; }

cleanup() {
	set +e
	for h in "${hosts[@]}"; do
		[ -n "${pid[$h]:-}" ] || continue
		# Close what the host holds and owns; a run another host owns is
		# that host's to close.
		for r in $("$rr" list --socket "${sock[$h]}" -o json 2>/dev/null | sed -n 's/.*"id": "\([^"]*\)".*/\1/p'); do
			"$rr" close "$r" --socket "${sock[$h]}" --reason "fleet demo over" >/dev/null 2>&1
		done
	done
	for h in "${hosts[@]}"; do
		[ -n "${pid[$h]:-}" ] && kill -TERM "${pid[$h]}" 2>/dev/null && wait "${pid[$h]}"
	done
	[ -n "$etcd" ] && kill -TERM "$etcd" 2>/dev/null && wait "$etcd"
	# Nothing of the demo may be left running: no containerd, no shim.
	sleep 1
	left=$(pgrep -af "$work" || true)
	if [ -n "$left" ]; then
		echo "fleet-demo: left running:" >&2
		echo "$left" >&2
	fi
	rm -rf "$work"
}
trap cleanup EXIT

step "etcd: a 3-member cluster on loopback (cmd/fleetdemo)"
go build -o "$work/fleetdemo" ./cmd/fleetdemo
"$work/fleetdemo" >"$work/etcd.out" 2>"$work/etcd.log" &
etcd=$!
for _ in $(seq 1 100); do
	[ -s "$work/etcd.out" ] && break
	kill -0 "$etcd" 2>/dev/null || { cat "$work/etcd.log"; exit 1; }
	sleep 0.1
done
E=$(head -n 1 "$work/etcd.out")
echo "endpoints: $E"

port=17440
for h in "${hosts[@]}"; do
	state=$work/$h
	sock[$h]=$state/runrecordd.sock
	key[$h]=$("$rr" fleet key --state-dir "$state")
	step "$h: admit ${key[$h]}, serve on 127.0.0.1:$port"
	"$rr" fleet admit "${key[$h]}" --name "$h" --etcd "$E"
	"$rr" serve --state-dir "$state" --etcd "$E" --peer-listen "127.0.0.1:$port" >"$work/$h.log" 2>&1 &
	pid[$h]=$!
	port=$((port + 1))
	for _ in $(seq 1 300); do
		"$rr" host --socket "${sock[$h]}" >/dev/null 2>&1 && break
		kill -0 "${pid[$h]}" 2>/dev/null || { cat "$work/$h.log"; exit 1; }
		sleep 0.1
	done
	for u in oracle poller; do
		"$rr" images import "$bin/units/$u.tar" --name "runrecordd.local/$u:1" --socket "${sock[$h]}" >/dev/null
	done
done

step "fleet status"
"$rr" fleet status --etcd "$E"

step "h1: the state oracle (image) and two pollers (transcript)"
"$rr" run --socket "${sock[h1]}" --id oracle --env SIZE_MB=64 runrecordd.local/oracle:1
for i in 1 2; do
	"$rr" run --socket "${sock[h1]}" --id "poller-$i" --mode transcript runrecordd.local/poller:1
done
sleep 3
"$rr" list --socket "${sock[h1]}"

step "drain h1 (transcript runs first; each outcome as it ends)"
"$rr" drain --socket "${sock[h1]}"

step "where the runs are now"
for h in h2 h3; do
	echo "-- $h"
	"$rr" list --socket "${sock[$h]}"
done
echo "-- h1 (handed off)"
"$rr" list --socket "${sock[h1]}"
"$rr" fleet status --etcd "$E"

step "the oracle goes on where it went"
for h in h2 h3; do
	if "$rr" list --socket "${sock[$h]}" | grep -q '^oracle.*running'; then
		tail -n 1 "$work/$h/runs/oracle/stdout" | cut -c1-160
		"$rr" verify oracle --socket "${sock[$h]}"
	fi
done
echo
echo "fleet-demo: done"
