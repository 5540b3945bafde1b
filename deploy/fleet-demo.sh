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
chmod 0711 "$work" # units run as their user namespace's root: runc must reach their rootfs below it
source deploy/fleet-lib.sh

step() { printf '\n== %s\n' "$*"; }
trap fleet_cleanup EXIT

step "etcd: a 3-member cluster on loopback (cmd/fleetdemo)"
fleet_etcd
echo "endpoints: $E"
port=17440
for h in h1 h2 h3; do
	step "$h: admit, serve on 127.0.0.1:$port"
	fleet_host "$h" "$port"
	echo "key ${key[$h]}"
	port=$((port + 1))
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
