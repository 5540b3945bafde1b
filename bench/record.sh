#!/usr/bin/env bash
# Record-core benchmarks on one core, 1,000,000-segment records.
# Usage: bench/record.sh [COUNT]   (COUNT repetitions, default 5; medians via benchstat if installed)
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-5}
go test -run XXX -bench 'Verify|WaitProof|Append' -benchtime 3x -count "$count" -cpu 1 ./pkg/record | tee /tmp/runrecordd-bench-record.txt
if command -v benchstat >/dev/null; then benchstat /tmp/runrecordd-bench-record.txt; fi
