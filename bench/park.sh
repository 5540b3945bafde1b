#!/usr/bin/env bash
# Park benchmark, side by side on one 512 MiB unit (units/ballast, SIZE_MB=512):
#   runrecordd park and resume          client wall time of `runrecordd park RUN` / `resume RUN`
#   ctr container checkpoint / restore  `ctr c checkpoint --task --rw` (CRIU dump tarred into the
#                                       content store) / `ctr c restore --live --rw`
#   raw runc checkpoint                 `runc checkpoint --image-path` on a task containerd started
# Each round runs every method once on a fresh unit, in an order that rotates from round to
# round, so the machine's noise falls on all of them alike. Before each checkpoint the unit has
# printed its ready line; after each restore its next tick must carry the same start time (the
# process continued, it was not restarted). Every timed command starts after a `sync` and a
# drop of the page cache (settle), so no method pays for the writeback of another's image, and
# none writes into memory another has just freed: on the virtual machines this project runs
# on, memory just freed is much faster to fill than memory the guest has not touched lately,
# and raw runc's images, deleted at once, used to hand the next method warm memory that a
# runrecordd park, whose images are kept, never hands back. raw runc is also timed with a
# syncfs of its image directory after the dump ("runc checkpoint+sync"): a park makes its
# images durable before it records them, and that is its durable equivalent. Prints median, min and max per operation
# and the ratios issue 35 sets targets for, and per round runrecordd's own breakdown of each
# park and resume (the -o json output). Everything it creates (a private containerd for
# ctr/runc, a runrecordd daemon with its own state dir, cgroups, images, FIFOs) lives under
# one temporary directory and is removed on exit, failure included.
# Usage: bench/park.sh [N]   (N rounds, default 5; as root)
#   PARK_BENCH_METHODS="runrecordd ctr runc"  the methods to run (default: all; runrecordd is
#                                             left out, as pending, while the CLI has no `serve`)
#   PARK_BENCH_SERVE_FLAGS="--lazy-resume=false"  serve flags (default none: lazy, served resumes)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=/tmp/runrecordd-bench-park.txt # per-round figures and the summary, kept after the run
image=runrecordd.local/ballast:1
size_mb=512
tick_ms=250 # the ballast's tick: after a restore its next line comes within a quarter second
wait_s=60   # how long to wait for a ready line or a tick before giving up

[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "usage: bench/park.sh [N]" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "bench/park.sh: needs root (containerd, runc, CRIU)" >&2; exit 1; }
# runc, started by the shims and by this script, finds CRIU on PATH; the CRIU that
# deploy/setup.sh installs must come first.
export PATH=/usr/local/sbin:$PATH
for b in containerd ctr runc criu jq go; do
	command -v "$b" >/dev/null || { echo "bench/park.sh: $b not found; run deploy/setup.sh" >&2; exit 1; }
done
criu check >/dev/null 2>&1 || { echo "bench/park.sh: \`criu check\` fails; run deploy/setup.sh" >&2; exit 1; }

tmp=$(mktemp -d /tmp/rrpark.XXXXXX) # short: unix socket paths under it must stay < 108 bytes
chmod 0711 "$tmp" # units run as their user namespace's root: runc must reach their rootfs below it
tag=$(basename "$tmp" | tr -cd 'a-zA-Z0-9' | tr 'A-Z' 'a-z')
ns=parkbench-$tag        # containerd namespace; also ctr's cgroup parent, /$ns/<id>
cd_dir=$tmp/containerd   # the private containerd for ctr and runc
cd_sock=$cd_dir/containerd.sock
runc_root=$tmp/runc      # runc --root given to the shims (ctr run --runc-root); runc adds /$ns
rr_dir=$tmp/runrecordd   # runrecordd serve --state-dir
rr_sock=$rr_dir/runrecordd.sock
cd_pid='' rr_pid=''
rr_open='' # the runrecordd run of the current round, closed by cleanup if a round fails
# Shims and ctr make these whatever daemon they belong to; those that were absent are removed
# at the end if empty.
run_dirs="/run/containerd/fifo /run/containerd/s /run/containerd/runc /run/containerd"
run_dirs_before=$(ls -d $run_dirs 2>/dev/null || true)
# The cgroup parent of the daemon's embedded containerd (executor.Containerd.Config: the first
# 4 bytes of the SHA-256 of its directory, DIR/containerd).
rr_cgroup=runrecordd-$(printf '%s' "$rr_dir/containerd" | sha256sum | cut -c1-8)

ctrx() { ctr --address "$cd_sock" --namespace "$ns" "$@"; }
rr() { RUNRECORDD_SOCKET=$rr_sock "$tmp/bin/runrecordd" "$@"; }
log() { printf '%s\n' "$*" >&2; }
fail() {
	log "bench/park.sh: $*"
	exit 1
}

# pids_under DIR: the pids of processes whose command line names DIR (shims of our daemons
# that outlived their task). Matched on our own unique temporary path, killed by pid.
pids_under() {
	local p
	for p in /proc/[0-9]*; do
		{ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "$1" && echo "${p#/proc/}"
	done
	return 0
}

cleanup() {
	local rc=$? id p
	set +e
	trap - EXIT INT TERM
	if ((rc != 0)); then
		log "--- bench/park.sh failed (exit $rc); log tails before cleanup:"
		tail -n 5 "$cd_dir/containerd.log" "$tmp/serve.log" 2>/dev/null >&2
		for p in "$tmp"/work/*/dump.log; do [[ -e $p ]] && tail -n 5 "$p" >&2; done
	fi
	# runrecordd: close our runs while the daemon is up (tasks outlive a stopped daemon).
	if [[ -n $rr_pid ]]; then
		[[ -n $rr_open ]] && rr close "$rr_open" >/dev/null 2>&1
		kill -TERM "$rr_pid" 2>/dev/null
		for _ in $(seq 150); do kill -0 "$rr_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$rr_pid" 2>/dev/null
	fi
	# The private containerd: delete every task, container and image in our namespace.
	if [[ -n $cd_pid ]]; then
		for id in $(ctrx t ls -q 2>/dev/null); do ctrx t rm -f "$id" >/dev/null 2>&1; done
		for id in $(ctrx c ls -q 2>/dev/null); do ctrx c rm "$id" >/dev/null 2>&1; done
		for id in $(ctrx i ls -q 2>/dev/null); do ctrx i rm "$id" >/dev/null 2>&1; done
		kill -TERM "$cd_pid" 2>/dev/null
		for _ in $(seq 150); do kill -0 "$cd_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$cd_pid" 2>/dev/null
	fi
	# Containers left in any runc root under our directory (a daemon that could not delete
	# them): runc kills their processes and removes their cgroups.
	find "$tmp" -path '*/runc/*/state.json' 2>/dev/null | while read -r p; do
		runc --root "$(dirname "$(dirname "$p")")" delete -f "$(basename "$(dirname "$p")")" >/dev/null 2>&1
	done
	# Anything left that runs from our directory (a shim whose task could not be deleted).
	for p in $(pids_under "$tmp/"); do kill -KILL "$p" 2>/dev/null; done
	# Mounts under our directory (rootfs of a task killed the hard way), deepest first.
	awk -v d="$tmp/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
		while read -r p; do umount -l "$p"; done
	# ctr's FIFOs for restored tasks (ctr 1.6 always puts them under /run/containerd/fifo).
	for p in /run/containerd/fifo/*/parkbench-"$tag"-*-stdout; do [[ -e $p ]] && rm -rf "$(dirname "$p")"; done
	for p in $run_dirs; do
		grep -qxF "$p" <<<"$run_dirs_before" || rmdir "$p" 2>/dev/null
	done
	# cgroups: ctr's parent /$ns and runrecordd's, in every hierarchy, once empty.
	for p in /sys/fs/cgroup/{*/,}{"$ns","$rr_cgroup"}; do
		[[ -d $p ]] && find "$p" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now_us() { echo "${EPOCHREALTIME/./}"; }

# wait_line FILE SKIP: waits until FILE has more than SKIP complete lines and prints line
# SKIP+1 as "counter start_time"; fails on a line with "error" or after $wait_s seconds.
wait_line() {
	local file=$1 skip=$2 deadline=$((SECONDS + wait_s)) n
	while :; do
		n=$(wc -l <"$file" 2>/dev/null || echo 0)
		((n > skip)) && break
		((SECONDS < deadline)) || fail "no line $((skip + 1)) in $file after ${wait_s}s"
		sleep 0.02
	done
	sed -n "$((skip + 1))p" "$file" |
		jq -e -r 'if .error then "unit error: \(.error)" | halt_error(1) else "\(.counter) \(.start_time)" end' ||
		fail "bad line $((skip + 1)) in $file"
}

# same_process WHAT START LINE: the line after a restore must have the start time the unit
# had before the checkpoint.
same_process() {
	[[ ${3#* } == "$2" ]] || fail "$1: the unit restarted (start time ${3#* }, was $2)"
}

results=$tmp/results.tsv # method op round ms
: >"$results"
record() { # record METHOD OP ROUND START_US END_US
	local ms
	ms=$(awk -v a="$4" -v b="$5" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
	printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$ms" >>"$results"
	printf '  round %d  %-10s %-10s %9s ms\n' "$3" "$1" "$2" "$ms" >&2
}

# --- set-up -----------------------------------------------------------------------------------

mkdir -p "$tmp/bin" "$tmp/out" "$tmp/img" "$tmp/work" "$cd_dir/root" "$cd_dir/state" "$runc_root"
log "building the ballast unit and runrecordd"
go run ./cmd/mkunit -o "$tmp/ballast.tar" -name "$image" ./units/ballast >/dev/null
go build -o "$tmp/bin/runrecordd" ./cmd/runrecordd

methods=${PARK_BENCH_METHODS:-runrecordd ctr runc}
rr_pending=0
serve_help=$("$tmp/bin/runrecordd" serve --help 2>&1 || true)
if [[ " $methods " == *" runrecordd "* && $serve_help == *'unknown command "serve"'* ]]; then
	if [[ -n ${PARK_BENCH_METHODS:-} ]]; then fail "runrecordd has no serve command yet"; fi
	log "runrecordd has no serve command yet: its column is pending"
	methods=${methods//runrecordd/}
	rr_pending=1
fi
read -r -a methods <<<"$methods"
((${#methods[@]} > 0)) || fail "no methods to run"

if [[ " ${methods[*]} " == *" ctr "* || " ${methods[*]} " == *" runc "* ]]; then
	# The shape of executor.StartContainerd's config: only what ctr and runc need.
	cat >"$cd_dir/config.toml" <<EOF
# bench/park.sh: a private containerd for the ctr and runc measurements.
version = 2
root = "$cd_dir/root"
state = "$cd_dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]

[grpc]
  address = "$cd_sock"
  uid = 0
  gid = 0

[ttrpc]
  address = "$cd_sock.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

# Collect after every deletion, so a checkpoint's blobs go once its image is removed.
[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 1
  schedule_delay = "0ms"
EOF
	# Its own session: a ^C at the terminal is for this script, which then deletes the
	# daemon's tasks before stopping it. Its own TMPDIR: containerd 1.6 unpacks a content-store
	# checkpoint for a restore into os.MkdirTemp($XDG_RUNTIME_DIR, "ctrd-checkpoint") and never
	# removes it (0.5 GB a round here), so that directory must be one this script removes.
	mkdir -p "$cd_dir/tmp"
	env -u XDG_RUNTIME_DIR TMPDIR="$cd_dir/tmp" \
		setsid containerd --config "$cd_dir/config.toml" >>"$cd_dir/containerd.log" 2>&1 &
	cd_pid=$!
	deadline=$((SECONDS + 30))
	until ctrx version >/dev/null 2>&1; do
		kill -0 "$cd_pid" 2>/dev/null || { tail -n 20 "$cd_dir/containerd.log" >&2; fail "containerd exited"; }
		((SECONDS < deadline)) || fail "containerd did not answer at $cd_sock within 30s"
		sleep 0.05
	done
	ctrx images import "$tmp/ballast.tar" >/dev/null
	blobs=$(ctrx content ls -q | wc -l) # the image's own; a round waits for its checkpoint's to go
fi

if [[ " ${methods[*]} " == *" runrecordd "* ]]; then
	# What this uses of runrecordd: serve --state-dir DIR --socket PATH, images import, run -o json
	# (→ "id"), park/resume -o json (→ "duration_ns", "checkpoint", "restore"), close; the
	# unit's stdout in DIR/runs/<RUN>/stdout.
	mkdir -p "$rr_dir"
	# shellcheck disable=SC2086 # PARK_BENCH_SERVE_FLAGS: words, e.g. --lazy-resume=false
	setsid "$tmp/bin/runrecordd" serve --state-dir "$rr_dir" --socket "$rr_sock" ${PARK_BENCH_SERVE_FLAGS:-} >>"$tmp/serve.log" 2>&1 &
	rr_pid=$!
	deadline=$((SECONDS + 60))
	until [[ -S $rr_sock ]]; do
		kill -0 "$rr_pid" 2>/dev/null || { tail -n 20 "$tmp/serve.log" >&2; fail "runrecordd serve exited"; }
		((SECONDS < deadline)) || fail "runrecordd serve did not create $rr_sock within 60s"
		sleep 0.05
	done
	rr images import --name "$image" "$tmp/ballast.tar" >/dev/null
fi

# --- one round of each method -----------------------------------------------------------------

ctr_start() { # ctr_start ID: a ballast task whose output goes to $tmp/out/ID.log; prints its ready line
	ctrx run -d --runc-root "$runc_root" --log-uri "file://$tmp/out/$1.log" \
		--env SIZE_MB=$size_mb --env TICK_MS=$tick_ms "$image" "$1" >/dev/null
	wait_line "$tmp/out/$1.log" 0
}

ctr_remove() { # ctr_remove ID: kill and delete the task, delete the container and its snapshot
	ctrx t rm -f "$1" >/dev/null 2>&1 || true
	ctrx c rm "$1" >/dev/null
}

# settle writes everything back and drops the page cache (see the header).
settle() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
}

round_ctr() {
	local r=$1 id=parkbench-$tag-ctr-$1 ref=parkbench.local/checkpoint:$1 ready t0 t1 fifo line
	ready=$(ctr_start "$id")
	settle
	t0=$(now_us)
	ctrx containers checkpoint --task --rw "$id" "$ref" >/dev/null
	t1=$(now_us)
	record ctr checkpoint "$r" "$t0" "$t1"
	# ctr's checkpoint leaves the task running; restore needs the container gone.
	ctr_remove "$id"
	settle
	t0=$(now_us)
	ctrx containers restore --live --rw "$id" "$ref" >/dev/null
	t1=$(now_us)
	record ctr restore "$r" "$t0" "$t1"
	# The restored task's stdout is a FIFO ctr stopped reading when it returned; read its next tick there.
	fifo=$(ls /run/containerd/fifo/*/"$id"-stdout 2>/dev/null | head -n 1)
	[[ -p $fifo ]] || fail "ctr restore: no stdout FIFO for $id under /run/containerd/fifo"
	timeout "$wait_s" head -n 1 "$fifo" >"$tmp/out/$id.restored" || fail "ctr restore: no tick from $id"
	line=$(wait_line "$tmp/out/$id.restored" 0)
	same_process "ctr restore" "${ready#* }" "$line"
	ctr_remove "$id"
	ctrx images rm --sync "$ref" >/dev/null
	rm -rf "$(dirname "$fifo")" "$tmp/out/$id".* "$cd_dir"/tmp/ctrd-checkpoint*
	# The GC deletes the 0.5 GB blob in the background; let it finish before the next
	# measurement.
	local deadline=$((SECONDS + wait_s))
	until (($(ctrx content ls -q | wc -l) <= blobs)); do
		((SECONDS < deadline)) || fail "containerd kept the checkpoint's blobs for ${wait_s}s"
		sleep 0.05
	done
}

round_runc() {
	local r=$1 id=parkbench-$tag-runc-$1 t0 t1 t2
	ctr_start "$id" >/dev/null
	settle
	t0=$(now_us)
	runc --root "$runc_root/$ns" checkpoint --image-path "$tmp/img/$id" --work-path "$tmp/work/$id" "$id"
	t1=$(now_us)
	sync -f "$tmp/img/$id"
	t2=$(now_us)
	record runc checkpoint "$r" "$t0" "$t1"
	record runc checkpoint+sync "$r" "$t0" "$t2"
	ctr_remove "$id"
	rm -rf "$tmp/img/$id" "$tmp/work/$id" "$tmp/out/$id".*
}

round_runrecordd() {
	local r=$1 id ready t0 t1 stdout lines line
	rr_open=parkbench-$tag-rr-$r
	id=$(rr run -o json --id "$rr_open" --env SIZE_MB=$size_mb --env TICK_MS=$tick_ms "$image" | jq -er .id)
	rr_open=$id
	stdout=$rr_dir/runs/$id/stdout
	ready=$(wait_line "$stdout" 0)
	settle
	t0=$(now_us)
	rr park -o json "$id" >"$tmp/out/$id.park.json"
	t1=$(now_us)
	record runrecordd park "$r" "$t0" "$t1"
	lines=$(wc -l <"$stdout")
	settle
	t0=$(now_us)
	rr resume -o json "$id" >"$tmp/out/$id.resume.json"
	t1=$(now_us)
	record runrecordd resume "$r" "$t0" "$t1"
	line=$(wait_line "$stdout" "$lines")
	same_process "runrecordd resume" "${ready#* }" "$line"
	# The daemon's own view of the two steps, for the log.
	jq -r --arg r "$r" --slurpfile res "$tmp/out/$id.resume.json" '"  round \($r)  runrecordd daemon-side: park \(.duration_ns / 1e6 | floor) ms (pause \(.checkpoint.pause_ns / 1e6 | floor), dump \(.checkpoint.dump_ns / 1e6 | floor), rw diff \(.checkpoint.diff_ns / 1e6 | floor), ingest+sync \(.checkpoint.ingest_ns / 1e6 | floor); CRIU frozen \(.checkpoint.frozen_ns / 1e6 | floor), \(.checkpoint.pages_written) pages), resume \($res[0].duration_ns / 1e6 | floor) ms (restore \($res[0].restore.total_ns // 0 | . / 1e6 | floor): materialize \($res[0].restore.materialize_ns // 0 | . / 1e6 | floor), rootfs \($res[0].restore.rootfs_ns // 0 | . / 1e6 | floor), task \($res[0].restore.task_ns // 0 | . / 1e6 | floor))"' \
		"$tmp/out/$id.park.json" >&2 || true
	rr close "$id" >/dev/null
	rr_open=''
}

log "$rounds rounds of: ${methods[*]} (order rotates each round; 512 MiB ballast; images under $tmp)"
for ((r = 1; r <= rounds; r++)); do
	n=${#methods[@]}
	for ((k = 0; k < n; k++)); do
		"round_${methods[(r - 1 + k) % n]}" "$r"
	done
done

# --- summary ----------------------------------------------------------------------------------

summary_of() { # summary_of METHOD OP: "median min max" in ms, or "- - -"
	awk -F'\t' -v m="$1" -v o="$2" '$1 == m && $2 == o { print $4 }' "$results" | sort -n |
		awk '{ v[NR] = $1 } END {
			if (NR == 0) { print "- - -"; exit }
			med = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
			printf "%.0f %.0f %.0f\n", med, v[1], v[NR] }'
}
ratio() { # ratio NUM DEN [TARGET]
	awk -v a="$1" -v b="$2" -v t="${3:-}" 'BEGIN {
		if (a == "-" || b == "-" || a == "pending") { print "pending"; exit }
		r = a / b; printf "%.2f", r
		if (t != "") printf " (target <= %s: %s)", t, r <= t + 0 ? "met" : "missed"
		print "" }'
}
{
	echo "bench/park.sh $rounds: 512 MiB ballast, $(date -u +%FT%TZ), $(uname -r), $(nproc) cores"
	echo "containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1 {print $3}'), CRIU $(criu --version | awk '/^Version/ {print $2}')"
	printf '%-22s %8s %8s %8s   (ms, %d rounds)\n' operation median min max "$rounds"
	for mo in "runrecordd park" "runrecordd resume" "ctr checkpoint" "ctr restore" "runc checkpoint" "runc checkpoint+sync"; do
		read -r med lo hi <<<"$(summary_of $mo)"
		if [[ $med == - && ${mo%% *} == runrecordd && $rr_pending == 1 ]]; then med=pending; fi
		printf '%-22s %8s %8s %8s\n' "$mo" "$med" "$lo" "$hi"
	done
	read -r park _ <<<"$(summary_of runrecordd park)"
	read -r resume _ <<<"$(summary_of runrecordd resume)"
	read -r ctrck _ <<<"$(summary_of ctr checkpoint)"
	read -r ctrrs _ <<<"$(summary_of ctr restore)"
	read -r runcck _ <<<"$(summary_of runc checkpoint)"
	read -r runcsync _ <<<"$(summary_of runc checkpoint+sync)"
	echo "park / ctr checkpoint:    $(ratio "$park" "$ctrck" 0.35)"
	echo "park / runc checkpoint:   $(ratio "$park" "$runcck")"
	echo "park / runc ckpt+sync:    $(ratio "$park" "$runcsync" 1.1)"
	echo "resume / ctr restore:     $(ratio "$resume" "$ctrrs" 0.15)"
	echo "ctr checkpoint / runc:    $(ratio "$ctrck" "$runcck")"
	echo
	echo "per round (method, operation, round, ms):"
	cat "$results"
} | tee "$out"
