#!/usr/bin/env bash
# Load test (issue 35; docs/benchmarks.md): N state oracles (units/oracle, SIZE MiB each,
# with memory, file, pipe and TCP state) run by a daemon of the benchmark's own, parked together
# and resumed together for ROUNDS rounds (bench/loadbench). Each park and resume is timed at the
# client, so time spent queued in the daemon counts; every oracle is checked after each resume
# and every record verified at the end. Prints each round, the p50 and p99 of each operation,
# and the store's size; the daemon's log is kept beside the output.
# Usage: bench/load.sh [-n 16] [-size 64] [-rounds 5] [-kill park|resume] [-verify 30] [-- SERVE FLAGS]
#   bench/load.sh -- --lazy-resume=false --chunked-images=false    the eager, whole-image load
#   bench/load.sh -kill resume                                      the daemon killed (SIGKILL) once
#                                                                   half the middle round's resumes answered
# Everything it makes (the daemon's state, its containerd, sandboxes, mounts) lives under one
# temporary directory; on exit, failure included, what still runs from it is killed, its
# sandboxes' cgroups removed, its mounts unmounted and the directory removed.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "bench/load.sh: needs root (containerd, runc, CRIU)" >&2; exit 1; }
export PATH=/usr/local/sbin:$PATH # the CRIU deploy/setup.sh installs (a PATH given first wins)
[[ -n ${LOAD_PATH:-} ]] && export PATH=$LOAD_PATH:$PATH
tmp=$(mktemp -d /tmp/rrload.XXXXXX)
chmod 0711 "$tmp" # units run as their user namespace's root: runc must reach their rootfs below it
out=/tmp/runrecordd-bench-load.txt
source bench/tmpdir-lib.sh

# The cgroup parent of the daemon's sandboxes (executor.Containerd.Config).
cgroup=runrecordd-$(printf '%s' "$tmp/state/containerd" | sha256sum | cut -c1-8)

load_exit() {
	local rc=$? d p
	set +e
	cp "$tmp/daemon.log" "${out%.txt}-daemon.log" 2>/dev/null
	bench_tmp_cleanup_procs
	for d in /sys/fs/cgroup/*/"$cgroup" /sys/fs/cgroup/"$cgroup"; do
		[[ -d $d ]] || continue
		for p in $(cat "$d"/*/cgroup.procs "$d"/cgroup.procs 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
	done
	sleep 0.5
	for d in /sys/fs/cgroup/*/"$cgroup" /sys/fs/cgroup/"$cgroup"; do
		[[ -d $d ]] || continue
		find "$d" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
		rmdir "$d" 2>/dev/null || echo "bench/load.sh: could not remove the cgroup $d" >&2
	done
	bench_tmp_cleanup
	exit "$rc"
}
# bench_tmp_cleanup_procs: bench_tmp_cleanup's first step, before the
# cgroups go (a shim would hold its sandbox's).
bench_tmp_cleanup_procs() {
	local p
	for p in /proc/[0-9]*; do
		{ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "$tmp/" && kill -KILL "${p#/proc/}" 2>/dev/null
	done
}
bench_tmp_trap load_exit

go build -o "$tmp/runrecordd" ./cmd/runrecordd
CGO_ENABLED=0 go build -o "$tmp/runrecordd-gate" ./cmd/runrecordd-gate
go build -o "$tmp/loadbench" ./bench/loadbench
"$tmp/loadbench" -bin "$tmp/runrecordd" -dir "$tmp" "$@" | tee "$out"
