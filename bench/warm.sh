#!/usr/bin/env bash
# Transcript resume from a warm sandbox (docs/warm-pool.md) against plain
# container create + start, side by side in one run on one embedded
# containerd (bench/transcriptbench -warm): posted result → unit running,
# medians and p99s. As root.
# Usage: bench/warm.sh [ROUNDS]   (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-50}
go run ./cmd/mkunit -o bin/units/poller.tar -name runrecordd.local/poller:1 ./units/poller >/dev/null
go build -o bin/transcriptbench ./bench/transcriptbench
# The gate warm sandboxes start in, beside the bench's binary (its daemon
# finds it there: docs/warm-pool.md). RUNRECORDD_BENCH_NO_GATE=1 leaves it
# out: warm sandboxes then start with runc start.
if [[ ${RUNRECORDD_BENCH_NO_GATE:-0} == 1 ]]; then
	rm -f bin/runrecordd-gate
else
	CGO_ENABLED=0 go build -o bin/runrecordd-gate ./cmd/runrecordd-gate
fi
bin/transcriptbench -image bin/units/poller.tar -n "$n" -warm 8
