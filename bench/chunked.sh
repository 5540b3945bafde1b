#!/usr/bin/env bash
# Chunked images through the daemon (issue 15, "parks store only what changed";
# docs/chunked-images.md, "Which chunking"): `runrecordd serve --chunked-images` runs units/ballast
# (SIZE MiB, FILL=random) and parks it N times, resuming it between two parks and having it
# change PCT percent of its pages (MODE: spread, contiguous or lines; SIGUSR2) before the next.
# For each park it prints CRIU's image bytes, the bytes the store grew by (object files, staging
# excluded) and their ratio; then the bundle of the run parked N times (`export -handoff=false`)
# against one image. The issue's targets: park 2 adds at most 5% of the image; a bundle of
# 5 parks is at most 1.2x one image. Each park's and resume's client wall time (ms) is printed
# beside it, and the park's ingest (ms from CRIU's return until both trees are stored).
# CHUNKED=0 runs the daemon with --chunked-images=false, for the same figures of the
# whole-file store.
# Usage: bench/chunked.sh [-n 5] [-size 512] [-pct 1] [-mode spread]   (as root)
# Everything it starts (the daemon, its embedded containerd, the unit) lives under one
# temporary directory and is removed on exit, failure included.
set -euo pipefail
[[ -n ${TRACE:-} ]] && set -x
cd "$(dirname "$0")/.."
n=5 size=512 pct=1 mode=spread
while (($#)); do
	case $1 in
	-n) n=$2 ;;
	-size) size=$2 ;;
	-pct) pct=$2 ;;
	-mode) mode=$2 ;;
	*) echo "usage: bench/chunked.sh [-n 5] [-size 512] [-pct 1] [-mode spread|contiguous|lines]" >&2; exit 2 ;;
	esac
	shift 2
done
[[ $(id -u) == 0 ]] || { echo "bench/chunked.sh: needs root (containerd, runc, CRIU)" >&2; exit 1; }
export PATH=/usr/local/sbin:$PATH # the CRIU deploy/setup.sh installs
for b in containerd runc criu jq go; do
	command -v "$b" >/dev/null || { echo "bench/chunked.sh: $b not found; run deploy/setup.sh" >&2; exit 1; }
done
tmp=$(mktemp -d /tmp/rrchunked.XXXXXX) # short: socket paths under it stay < 108 bytes
chmod 0711 "$tmp" # units run as their user namespace's root: runc must reach their rootfs below it
rr_dir=$tmp/state
rr_sock=$rr_dir/runrecordd.sock
rr_pid='' id=''
image=runrecordd.local/ballast:1
# The cgroup parent of the daemon's embedded containerd (executor.Containerd.Config).
rr_cgroup=runrecordd-$(printf '%s' "$rr_dir/containerd" | sha256sum | cut -c1-8)
source bench/tmpdir-lib.sh
rr() { RUNRECORDD_SOCKET=$rr_sock "$tmp/bin/runrecordd" "$@"; }
log() { printf '%s\n' "$*" >&2; }
fail() {
	log "bench/chunked.sh: $*"
	exit 1
}
cleanup() {
	local rc=$? p
	set +e
	((rc == 0)) || tail -n 20 "$tmp/serve.log" >&2 2>/dev/null
	if [[ -n $rr_pid ]]; then
		[[ -n $id ]] && rr close "$id" >/dev/null 2>&1
		kill -TERM "$rr_pid" 2>/dev/null
		for _ in $(seq 150); do kill -0 "$rr_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$rr_pid" 2>/dev/null
	fi
	bench_tmp_cleanup
	for p in /sys/fs/cgroup/{*/,}"$rr_cgroup"; do
		[[ -d $p ]] && find "$p" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	exit "$rc"
}
bench_tmp_trap cleanup

# store_bytes: the bytes of the store's object files, staging excluded.
store_bytes() {
	find "$rr_dir/store/objects" -path "$rr_dir/store/objects/tmp" -prune -o -type f -printf '%s\n' |
		awk '{ s += $1 } END { printf "%.0f\n", s }' # mawk prints %g, and its %d stops at 2^31
}
# wait_json JQ: waits (60 s at most) until a line of the unit's stdout satisfies JQ.
wait_json() {
	local deadline=$((SECONDS + 60))
	until jq -e -s "any(.[]; $1)" "$rr_dir/runs/$id/stdout" >/dev/null 2>&1; do
		((SECONDS < deadline)) || fail "no line with $1 in the unit's output"
		sleep 0.05
	done
	! jq -e -s 'any(.[]; .error)' "$rr_dir/runs/$id/stdout" >/dev/null || fail "the unit reports an error"
}
unit_pid() {
	local d
	for d in /sys/fs/cgroup/{*/,}"$rr_cgroup"; do
		[[ -d $d ]] || continue
		find "$d" -name cgroup.procs -exec cat {} +
	done | sort -u
}

mkdir -p "$tmp/bin" "$rr_dir"
log "building runrecordd and the ballast unit"
go build -o "$tmp/bin/runrecordd" ./cmd/runrecordd
go build -o "$tmp/bin/mkunit" ./cmd/mkunit
"$tmp/bin/mkunit" -o "$tmp/ballast.tar" -name "$image" ./units/ballast >/dev/null
flag=--chunked-images
[[ ${CHUNKED:-1} == 0 ]] && flag=--chunked-images=false
setsid "$tmp/bin/runrecordd" serve --state-dir "$rr_dir" --socket "$rr_sock" "$flag" >>"$tmp/serve.log" 2>&1 &
rr_pid=$!
deadline=$((SECONDS + 60))
until [[ -S $rr_sock ]]; do
	kill -0 "$rr_pid" 2>/dev/null || fail "runrecordd serve exited"
	((SECONDS < deadline)) || fail "runrecordd serve did not create $rr_sock within 60s"
	sleep 0.1
done
rr images import --name "$image" "$tmp/ballast.tar" >/dev/null
id=chunked
rr run -o json --id "$id" --memory $((size * 2 + 256))Mi --env SIZE_MB="$size" --env FILL=random \
	--env CHANGE_PCT="$pct" --env CHANGE_MODE="$mode" --env TICK_MS=250 "$image" >/dev/null
wait_json '.counter >= 1'
printf '%s\n' "chunked images: $flag; ballast $size MiB, $pct% $mode between two parks"
printf '%-5s %14s %14s %8s %8s %9s %9s %9s %12s\n' park image_bytes store_added ratio park_ms resume_ms ingest_ms frozen_ms mem_write_ms
first=0
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
for ((i = 1; i <= n; i++)); do
	before=$(store_bytes)
	t0=$(date +%s%N)
	read -r img ingest frozen memw < <(rr park -o json "$id" | jq -er '.checkpoint | "\(.image_bytes) \(.ingest_ns) \(.frozen_ns) \(.mem_write_ns)"')
	park_ms=$(ms "$t0")
	added=$(($(store_bytes) - before))
	((i == 1)) && first=$img
	resume_ms=-
	if ((i < n)); then
		t0=$(date +%s%N)
		rr resume -o json "$id" >/dev/null # returns with the unit running
		resume_ms=$(ms "$t0")
	fi
	awk -v i="$i" -v img="$img" -v a="$added" -v p="$park_ms" -v r="$resume_ms" -v g="$ingest" -v f="$frozen" -v w="$memw" 'BEGIN { printf "%-5d %14.0f %14.0f %7.2f%% %8s %9s %9.0f %9.0f %12.0f\n", i, img, a, 100 * a / img, p, r, g / 1e6, f / 1e6, w / 1e6 }'
	((i == n)) && break
	pid=$(unit_pid)
	[[ $pid =~ ^[0-9]+$ ]] || fail "not one unit process: $pid"
	kill -USR2 "$pid"
	wait_json "(.changes // 0) == $i"
done
rr export -handoff=false -f "$tmp/run.bundle" "$id"
bundle=$(stat -c %s "$tmp/run.bundle")
awk -v n="$n" -v b="$bundle" -v img="$first" 'BEGIN { printf "bundle of %d parks: %.0f bytes, %.3fx the first image\n", n, b, b / img }'
