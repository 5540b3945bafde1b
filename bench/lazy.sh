#!/usr/bin/env bash
# Lazy image resume benchmark (issue 15; docs/lazy-resume.md): bench/lazybench, side by side in
# one run, on a 512 MiB ballast parked into a store exactly as the daemon parks it, then resumed
# as the daemon resumes it (rehash, hard-linked layout, executor restore), eagerly (today) and
# lazily (criu lazy-pages + a CRIU config with lazy-pages), each from a dropped page cache; the
# -cold modes skip the rehash, so their restore starts from a cold page cache too; ctr is
# `ctr c restore --live --rw` (bench/park.sh's ctr method) on the same containerd. Prints every
# round, the medians (time to running; for lazy, the time until every page is resident) and the
# issue's ratios against ctr restore.
# Usage: bench/lazy.sh [lazybench flags]   (as root; default: -n 5 -size 512
#                                           -modes ctr,eager,lazy,eager-cold,lazy-cold)
#   bench/lazy.sh -kill 30ms [-hold]        the lazy-pages daemon killed mid-way: what the unit does
# Everything it makes (a private containerd, stores, sandboxes, the lazy-pages daemons) lives
# under one temporary directory and is removed on exit, failure included.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "bench/lazy.sh: needs root (containerd, runc, CRIU)" >&2; exit 1; }
export PATH=/usr/local/sbin:$PATH # the CRIU deploy/setup.sh installs, for runc and lazybench
command -v ctr >/dev/null || { echo "bench/lazy.sh: ctr not found; run deploy/setup.sh" >&2; exit 1; }
criu check --feature uffd-noncoop >/dev/null 2>&1 ||
	{ echo "bench/lazy.sh: \`criu check --feature uffd-noncoop\` fails: no lazy pages on this host" >&2; exit 1; }
tmp=$(mktemp -d /tmp/rrlazy.XXXXXX)
chmod 0711 "$tmp" # units run as their user namespace's root: runc must reach their rootfs below it
out=/tmp/runrecordd-bench-lazy.txt
source bench/tmpdir-lib.sh
bench_tmp_trap
go build -o "$tmp/lazybench" ./bench/lazybench
args=("$@")
((${#args[@]} > 0)) || args=(-n 5 -size 512 -modes ctr,eager,lazy,eager-cold,lazy-cold)
TMPDIR=$tmp "$tmp/lazybench" "${args[@]}" | tee "$out"
