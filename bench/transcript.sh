#!/usr/bin/env bash
# Transcript park and resume against plain containers, side by side in one
# run on one embedded containerd (bench/transcriptbench). As root.
# Usage: bench/transcript.sh [ROUNDS]   (default 15)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-15}
go run ./cmd/mkunit -o bin/units/poller.tar -name runrecordd.local/poller:1 ./units/poller >/dev/null
go build -o bin/transcriptbench ./bench/transcriptbench
bin/transcriptbench -image bin/units/poller.tar -n "$n"
