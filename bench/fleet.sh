#!/usr/bin/env bash
# bench/fleet.sh - the fleet's speed on this machine (docs/benchmarks.md),
# against a real 3-member etcd cluster and real hosts on loopback:
#  1. drain N transcript runs parked on their awaits from one host to two
#     others: the drain's total time and each run's p50/p99;
#  2. move an image run of SIZE_MB MiB between two hosts ROUNDS times each
#     way, side by side in one run: `migrate` in the fleet, and the manual
#     path (park, export, import, resume) between two hosts alone; the time
#     the unit is not running, medians and their ratio. The first move is
#     into a host holding none of the run; the later ones find the run's
#     earlier snapshots there. The hosts share this machine: each timed
#     operation starts once the last resume has every page in and after a
#     sync, so none pays for another's pages or writes.
# As root, after `make build`. Leaves nothing running; FLEET_LOGS=DIR keeps
# the hosts' and etcd's logs there, and `show RUN -o json` after each move
# (migrate-R.json, manual-R.json: the park's checkpoint, the restore). Every host serves
# at its defaults (lazy, served resumes; a migration post-copy: the target
# resumes before it holds the memory's slabs); --eager: with
# --lazy-resume=false; --whole: with --post-copy=false (every byte moved
# before the target resumes).
# Usage: bench/fleet.sh [--eager|--whole] [N] [ROUNDS] [SIZE_MB]   (default 200 3 512)
set -Eeuo pipefail
cd "$(dirname "$0")/.."
serve_flags=()
case "${1:-}" in
--eager) serve_flags=(--lazy-resume=false) && shift ;;
--whole) serve_flags=(--post-copy=false) && shift ;;
esac
n=${1:-200} rounds=${2:-3} size=${3:-512}
bin=bin
rr=$(realpath "$bin/runrecordd")
work=$(mktemp -d /tmp/rrfleet-XXXXXX)
chmod 0711 "$work" # units run as their user namespace's root: runc must reach their rootfs below it
source deploy/fleet-lib.sh
if [ -n "${FLEET_LOGS:-}" ]; then mkdir -p "$FLEET_LOGS"; fi
trap fleet_cleanup EXIT
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }

fleet_etcd
fleet_host h1 17540
fleet_host h2 17541
fleet_host h3 17542

echo "== drain: $n transcript runs parked on their awaits, h1 -> h2, h3"
for i in $(seq 1 "$n"); do
	"$rr" run --socket "${sock[h1]}" --id "a$i" --mode transcript --env STEPS=1 runrecordd.local/agent:1 >/dev/null
done
for _ in $(seq 1 600); do
	p=$("$rr" list --socket "${sock[h1]}" --phase parked -o json | grep -c '"id"' || true)
	[ "$p" -ge "$n" ] && break
	sleep 0.5
done
t0=$(date +%s%N)
"$rr" drain --socket "${sock[h1]}" -o json >"$work/drain.json"
total=$(ms "$t0")
python3 - "$work/drain.json" "$total" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
took = sorted(r["took_ns"] / 1e6 for r in d["runs"])
q = lambda p: took[min(len(took) - 1, int(p * len(took)))]
print(f"drained {d['moved']} runs ({d['left']} left) in {int(sys.argv[2])} ms: "
      f"{d['moved'] / (int(sys.argv[2]) / 1000):.1f} runs/s; per run p50 {q(0.50):.0f} ms, p99 {q(0.99):.0f} ms")
PY

[ "$rounds" -gt 0 ] || exit 0 # the drain alone
echo "== a $size MiB image run: migrate (fleet h2 <-> h3) and the manual path (alone m1 <-> m2), $rounds rounds each way"
for m in m1 m2; do
	state=$work/$m
	sock[$m]=$state/runrecordd.sock
	"$rr" serve --state-dir "$state" ${serve_flags[@]+"${serve_flags[@]}"} >"$work/$m.log" 2>&1 &
	pid[$m]=$!
	hosts+=("$m")
	for _ in $(seq 1 300); do "$rr" host --socket "${sock[$m]}" >/dev/null 2>&1 && break; sleep 0.1; done
	"$rr" images import "$bin/units/oracle.tar" --name runrecordd.local/oracle:1 --socket "${sock[$m]}" >/dev/null
done
for m in m1 m2; do
	o=m1; [ "$m" = m1 ] && o=m2
	k=$("$rr" host --socket "${sock[$o]}" -o json | sed -n 's/.*"key_id": "\([^"]*\)".*/\1/p')
	"$rr" trust add "$k" --name "$o" --socket "${sock[$m]}" >/dev/null
done
verified() { # verified STATE RUN: wait for the oracle's next verified line
	local f=$1/runs/$2/stdout c
	c=$(wc -l <"$f" 2>/dev/null || echo 0)
	for _ in $(seq 1 600); do
		[ "$(wc -l <"$f" 2>/dev/null || echo 0)" -gt "$c" ] && grep -q verified "$f" && return 0
		sleep 0.1
	done
	return 1
}
settled() { # settled STATE: the run's lazy restore there has every page in
	for _ in $(seq 1 300); do
		"$rr" show big --socket "$1/runrecordd.sock" -o json | python3 -c 'import json, sys
r = json.load(sys.stdin).get("restore") or {}
sys.exit(0 if not r.get("lazy") or r.get("resident_ns") or r.get("pages_lost") else 1)' && return 0
		sleep 0.1
	done
	return 1
}
"$rr" run --socket "${sock[h2]}" --id big --env SIZE_MB="$size" runrecordd.local/oracle:1 >/dev/null
"$rr" run --socket "${sock[m1]}" --id big --env SIZE_MB="$size" runrecordd.local/oracle:1 >/dev/null
verified "$work/h2" big
verified "$work/m1" big
from=h2 to=h3 mfrom=m1 mto=m2
: >"$work/mig.ms"
: >"$work/man.ms"
for r in $(seq 1 $((2 * rounds))); do
	sync
	t0=$(date +%s%N)
	"$rr" migrate big --to "${key[$to]}" --socket "${sock[$from]}" >/dev/null
	ms "$t0" >>"$work/mig.ms"
	verified "$work/$to" big
	settled "$work/$to"
	if [ -n "${FLEET_LOGS:-}" ]; then "$rr" show big --socket "${sock[$to]}" -o json >"$FLEET_LOGS/migrate-$r.json"; fi
	sync
	t0=$(date +%s%N)
	"$rr" park big --socket "${sock[$mfrom]}" >/dev/null
	"$rr" export big -f "$work/big.bundle" --socket "${sock[$mfrom]}" >/dev/null
	"$rr" import "$work/big.bundle" --socket "${sock[$mto]}" >/dev/null
	"$rr" resume big --socket "${sock[$mto]}" >/dev/null
	ms "$t0" >>"$work/man.ms"
	rm -f "$work/big.bundle"
	verified "$work/$mto" big
	settled "$work/$mto"
	if [ -n "${FLEET_LOGS:-}" ]; then "$rr" show big --socket "${sock[$mto]}" -o json >"$FLEET_LOGS/manual-$r.json"; fi
	tmp=$from; from=$to; to=$tmp
	tmp=$mfrom; mfrom=$mto; mto=$tmp
done
python3 - "$work/mig.ms" "$work/man.ms" <<'PY'
import statistics, sys
mig = [int(x) for x in open(sys.argv[1])]
man = [int(x) for x in open(sys.argv[2])]
print("migrate ms:", mig)
print("manual  ms:", man)
print(f"first move (the target holds none of the run): migrate {mig[0]} ms, manual {man[0]} ms")
a, b = statistics.median(mig), statistics.median(man)
print(f"median migrate {a:.0f} ms, manual {b:.0f} ms: migrate/manual {a / b:.2f} (target <= 0.7)")
PY
