#!/bin/bash
# uffd-refs.sh CRIU DIR [MODE...] : for each mode of uffd-refs.py (all by
# default), start it, `CRIU dump` it into DIR/MODE, `CRIU restore -d` it,
# and say what happened: the dump refused (and whether the process still
# runs), or the restore's result. Run as root; kills what it started.
set -u
criu=$1 dir=$2
shift 2
py=$(dirname "$(readlink -f "$0")")/uffd-refs.py
modes=("$@")
[[ ${#modes[@]} -gt 0 ]] || modes=(plain epev epoll dup dupep moved two scm scmep fork forkep feat0)
errors() { grep -E "$1" "$2" | grep -v RLIMIT_NOFILE | head -2 | sed 's/^([0-9. ]*) *//' | tr '\n' '|'; }
for mode in "${modes[@]}"; do
	d=$dir/$mode
	rm -rf "$d" && mkdir -p "$d" || exit 1
	setsid python3 "$py" "$mode" </dev/null >"$d/out" 2>"$d/err" &
	bg=$!
	for _ in $(seq 50); do [[ -s $d/out ]] && break; sleep 0.1; done
	pid=$(head -1 "$d/out")
	kid=$(cat /proc/"$pid"/task/*/children 2>/dev/null | tr -d ' ')
	if "$criu" dump -t "$pid" -D "$d" -v4 -o dump.log; then
		wait "$bg" 2>/dev/null
		# The pids are free again once the dump's kill is reaped.
		for _ in $(seq 300); do [[ -e /proc/$pid || -n $kid && -e /proc/$kid ]] || break; sleep 0.1; done
		if "$criu" restore -d -D "$d" -v4 -o restore.log; then
			echo "$mode: dump OK, restore OK"
		else
			echo "$mode: dump OK, restore FAILED: $(errors Error "$d/restore.log")"
		fi
	else
		running=no
		grep -q '^State:.*S' /proc/"$pid"/status 2>/dev/null && running=yes
		echo "$mode: dump REFUSED (still running: $running): $(errors Error "$d/dump.log")"
	fi
	kill -9 "$pid" $kid 2>/dev/null
	wait 2>/dev/null
done
