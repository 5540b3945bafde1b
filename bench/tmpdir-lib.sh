# bench/tmpdir-lib.sh - sourced by the benchmarks that keep everything they
# start under one temporary directory, $tmp.
#
# bench_tmp_cleanup kills whatever still runs from $tmp (a shim, a criu
# lazy-pages: by its command line), unmounts what is mounted under it,
# deepest first, and removes it.
bench_tmp_cleanup() {
	local p
	for p in /proc/[0-9]*; do
		{ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "$tmp/" && kill -KILL "${p#/proc/}" 2>/dev/null
	done
	awk -v d="$tmp/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
		while read -r p; do umount -l "$p"; done
	rm -rf "$tmp"
}

# bench_tmp_exit is an exit trap that runs bench_tmp_cleanup and keeps the
# script's exit status.
bench_tmp_exit() {
	local rc=$?
	set +e
	bench_tmp_cleanup
	exit "$rc"
}

# bench_tmp_trap arms the exit traps: $1 (bench_tmp_exit when not given)
# on exit, and an exit with the signal's status on INT and TERM, so that
# the exit trap runs then too.
bench_tmp_trap() {
	trap "${1:-bench_tmp_exit}" EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}
