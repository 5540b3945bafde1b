#!/usr/bin/env bash
# Store benchmarks on the store's own filesystem (t.TempDir, under $TMPDIR):
# durable appends (fsync per commit) for one run and for 64 concurrent runs
# (group commit), and directory-object ingest of a 1 GiB CRIU-like tree.
# Usage: bench/store.sh [COUNT]   (COUNT repetitions, default 5; medians via benchstat if installed)
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-5}
out=/tmp/runrecordd-bench-store.txt
go test -run XXX -bench 'Append' -benchtime 2s -count "$count" ./internal/store | tee "$out"
go test -run XXX -bench 'Ingest' -benchtime 3x -count "$count" ./internal/store | tee -a "$out"
if command -v benchstat >/dev/null; then benchstat "$out"; fi
