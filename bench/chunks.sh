#!/usr/bin/env bash
# Chunked memory images (issue 15, "parks store only what changed"; docs/chunked-images.md):
# bench/chunkbench. Takes N full CRIU dumps of one ballast unit (FILL=random) through the
# executor, the unit changing PCT percent of its memory between two (MODE: spread, contiguous,
# lines), then prints how the images lie and what each chunking would store, and the hashing
# costs.
# The built form, through the daemon (serve --chunked-images): bench/chunked.sh.
# Usage: bench/chunks.sh [-unit ballast|oracle] [-n 5] [-size 256] [-pct 1] [-mode spread]   (as root)
#        bench/chunks.sh analyze DIR1 DIR2 ...                           (any CRIU image dirs)
# Everything the dump makes (a private containerd, the sandbox, the images) lives under one
# temporary directory and is removed on exit, failure included; KEEP=DIR keeps the images there.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/rrchunks.XXXXXX)
chmod 0711 "$tmp" # units run as their user namespace's root: runc must reach their rootfs below it
go build -o "$tmp/chunkbench" ./bench/chunkbench
if [[ ${1:-} == analyze ]]; then
	shift
	"$tmp/chunkbench" analyze "$@"
	rm -rf "$tmp"
	exit
fi
[[ $(id -u) == 0 ]] || { echo "bench/chunks.sh: needs root (containerd, runc, CRIU)" >&2; exit 1; }
export PATH=/usr/local/sbin:$PATH # the CRIU deploy/setup.sh installs
source bench/tmpdir-lib.sh
bench_tmp_trap
out=${KEEP:-$tmp/images}
n=5
for ((i = 1; i <= $#; i++)); do [[ ${!i} == -n ]] && { j=$((i + 1)); n=${!j}; }; done
TMPDIR=$tmp "$tmp/chunkbench" dump -out "$out" "$@"
dirs=()
for ((i = 1; i <= n; i++)); do dirs+=("$out/$i"); done
"$tmp/chunkbench" analyze -ingest "$tmp/ingest" "${dirs[@]}"
