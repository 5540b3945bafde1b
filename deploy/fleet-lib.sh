# deploy/fleet-lib.sh - sourced by deploy/fleet-demo.sh and bench/fleet.sh:
# a real 3-member etcd cluster (cmd/fleetdemo) and runrecordd hosts on
# loopback, each with its own state directory and embedded containerd, all
# under $work, stopped and removed by fleet_cleanup. Needs $rr (the
# binary), $bin (its directory, with units/) and $work set.

declare -A pid key sock
hosts=()
etcd=
E=

# fleet_cleanup closes what every host holds, stops the hosts and etcd,
# reports anything of $work left running, and removes $work.
fleet_cleanup() {
	set +e
	for h in "${hosts[@]}"; do
		for r in $("$rr" list --socket "${sock[$h]}" -o json 2>/dev/null | sed -n 's/.*"id": "\([^"]*\)".*/\1/p'); do
			"$rr" close "$r" --socket "${sock[$h]}" --reason "over" >/dev/null 2>&1
		done
	done
	for h in "${hosts[@]}"; do
		kill -TERM "${pid[$h]}" 2>/dev/null && wait "${pid[$h]}"
	done
	[ -n "$etcd" ] && kill -TERM "$etcd" 2>/dev/null && wait "$etcd"
	sleep 1
	left=$(pgrep -af "$work" || true)
	if [ -n "$left" ]; then
		echo "fleet: left running:" >&2
		echo "$left" >&2
	fi
	[ -n "${FLEET_LOGS:-}" ] && mkdir -p "$FLEET_LOGS" && cp "$work"/*.log "$FLEET_LOGS"/
	rm -rf "$work"
}

# fleet_etcd starts the cluster and sets E to its endpoints.
fleet_etcd() {
	go build -o "$work/fleetdemo" ./cmd/fleetdemo
	"$work/fleetdemo" >"$work/etcd.out" 2>"$work/etcd.log" &
	etcd=$!
	for _ in $(seq 1 100); do
		[ -s "$work/etcd.out" ] && break
		kill -0 "$etcd" 2>/dev/null || { cat "$work/etcd.log"; return 1; }
		sleep 0.1
	done
	E=$(head -n 1 "$work/etcd.out")
}

# fleet_host NAME PORT admits and starts host NAME serving the fleet on
# 127.0.0.1:PORT, with the serve flags in the array serve_flags if set,
# and imports the demo units into it.
fleet_host() {
	local h=$1 state=$work/$1
	hosts+=("$h")
	sock[$h]=$state/runrecordd.sock
	key[$h]=$("$rr" fleet key --state-dir "$state")
	"$rr" fleet admit "${key[$h]}" --name "$h" --etcd "$E" >/dev/null
	"$rr" serve --state-dir "$state" --etcd "$E" --peer-listen "127.0.0.1:$2" ${serve_flags[@]+"${serve_flags[@]}"} >"$work/$h.log" 2>&1 &
	pid[$h]=$!
	for _ in $(seq 1 300); do
		"$rr" host --socket "${sock[$h]}" >/dev/null 2>&1 && break
		kill -0 "${pid[$h]}" 2>/dev/null || { cat "$work/$h.log"; return 1; }
		sleep 0.1
	done
	for u in oracle poller agent; do
		"$rr" images import "$bin/units/$u.tar" --name "runrecordd.local/$u:1" --socket "${sock[$h]}" >/dev/null
	done
}
