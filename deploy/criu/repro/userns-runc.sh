#!/usr/bin/env bash
# deploy/criu/repro/userns-runc.sh - checkpoint and restore a runc container
# in a user namespace, eagerly and lazily, with the CRIU given; the
# reproduction of 5-lazy-pages-userns-uffd.patch and
# 6-restore-cgns-after-userns-creds.patch (docs/notes/userns.md).
#
# Usage: userns-runc.sh [CASE...]      (default: every case)
#   plain-eager   no user namespace, eager restore (the baseline)
#   plain-lazy    no user namespace, lazy restore (criu lazy-pages)
#   userns-eager  uid/gid 0 -> HOSTID (65536 ids), network namespace made
#                 inside the user namespace (configured again on restore by
#                 a createRuntime hook), idmapped rootfs
#   userns-lazy   the same, lazy: fails without patch 5 ("Unable to open an
#                 userfaultfd descriptor: Operation not permitted")
#   userns-cgns   the same with a cgroup namespace and 65534 ids mapped:
#                 fails without patch 6 ("couldn't set cgns prefix")
#   userns-remap  checkpoint under HOSTID, restore under HOSTID+100000
#                 (rootfs, spec and the userns image remapped)
#   userns-overlay  userns-eager on an overlay rootfs made of idmapped
#                 lower and upper layers (ovlmount.c): the unit's writes
#                 land in the upper layer with in-namespace ids
#   userns-overlay-lazy  the same, restored lazily (patch 5)
# Environment: CRIU (default: criu on PATH), RUNC (default: runc on PATH;
# 1.1 and 1.2+ both work, the rootfs is idmapped here, not by runc),
# HOSTID (default 100000), REPEAT (default 1: each case N times, for
# timings), KEEP=1 keeps the work directory.
# Prints one line per step with its time, PASS or FAIL per case; exits 1
# if any case failed. Needs root, gcc, busybox-static, kernel >= 6.1.
# Leaves nothing behind: containers, mounts, cgroups, lazy-pages.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CRIU=${CRIU:-$(command -v criu || true)}
RUNC=${RUNC:-$(command -v runc || true)}
HOSTID=${HOSTID:-100000}
REPEAT=${REPEAT:-1}
IDS=65536
[[ $(id -u) -eq 0 ]] || { echo "must run as root" >&2; exit 2; }
[[ -x $CRIU && -x $RUNC ]] || { echo "need CRIU and RUNC (got '$CRIU', '$RUNC')" >&2; exit 2; }
[[ -x /bin/busybox ]] || { echo "need busybox-static (/bin/busybox)" >&2; exit 2; }

W=$(mktemp -d /tmp/userns-repro.XXXXXX)
chmod 755 "$W"
CASE_DIR=""
CASE_ID=""
LAZY_PID=""

cleanup_case() {
	[[ -n $CASE_DIR ]] || return 0
	if [[ -n $LAZY_PID ]]; then
		kill "$LAZY_PID" 2>/dev/null
		wait "$LAZY_PID" 2>/dev/null
		LAZY_PID=""
	fi
	"$RUNC" --root "$CASE_DIR/runc" delete -f "$CASE_ID" >/dev/null 2>&1
	umount -l "$CASE_DIR/bundle/rootfs" 2>/dev/null
	umount -l "$CASE_DIR/ml" 2>/dev/null
	umount -l "$CASE_DIR/mu" 2>/dev/null
	local c
	for c in /sys/fs/cgroup/*/"$CASE_ID" /sys/fs/cgroup/"$CASE_ID"; do
		if [[ -d $c ]]; then rmdir "$c" 2>/dev/null; fi
	done
	CASE_DIR=""
}
cleanup() {
	cleanup_case
	if [[ ${KEEP:-0} == 1 ]]; then echo "kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

gcc -O2 -Wall -o "$W/idmapmount" "$HERE/idmapmount.c" || exit 2
gcc -O2 -Wall -o "$W/ovlmount" "$HERE/ovlmount.c" || exit 2
# runc checkpoints and restores with --empty-ns net: the restored network
# namespace is new and empty (lo down, MPTCP back on). runc runs the
# spec's createRuntime hooks when it makes the container and again at
# CRIU's setup-namespaces, before any socket is restored: this one sets
# lo up and MPTCP off in the container's network namespace both times.
cat >"$W/netns-hook" <<'HOOK'
#!/bin/sh
pid=$(tr -d '\n' | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
[ -n "$pid" ] || exit 1
exec nsenter -t "$pid" -n sh -c 'ip link set lo up && if [ -e /proc/sys/net/mptcp/enabled ]; then echo 0 >/proc/sys/net/mptcp/enabled; fi'
HOOK
chmod 755 "$W/netns-hook"
mkdir -p "$W/bin"
ln -s "$CRIU" "$W/bin/criu" # runc 1.2+ runs the criu on PATH
RUNC_CRIU=()
if "$RUNC" --help 2>&1 | grep -q -- '--criu'; then RUNC_CRIU=(--criu "$CRIU"); fi
export PATH="$W/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

ms() {
	local t=${EPOCHREALTIME/[.,]/}
	echo $((t / 1000))
}

# rootfs DIR: a busybox root owned by 0:0 on disk.
rootfs() {
	mkdir -p "$1"/{bin,proc,dev,sys,tmp}
	cp /bin/busybox "$1/bin/busybox"
	local i
	for i in sh sleep nc cat; do ln -s busybox "$1/bin/$i"; done
}

# spec USERNS(0/1) HOST NIDS CGNS(0/1) LAZY(0/1) > config.json
spec() {
	local userns=$1 host=$2 nids=$3 cgns=$4 lazy=$5 maps="" ns=""
	if [[ $userns == 1 ]]; then
		maps="\"uidMappings\": [{\"containerID\": 0, \"hostID\": $host, \"size\": $nids}],
		\"gidMappings\": [{\"containerID\": 0, \"hostID\": $host, \"size\": $nids}],"
		ns='{"type": "user"},'
	fi
	if [[ $cgns == 1 ]]; then ns+='{"type": "cgroup"},'; fi
	local dev='{"allow": false, "access": "rwm"}'
	# A lazy restore in a user namespace opens /dev/userfaultfd from CRIU,
	# which runc has moved into the container's cgroup (patch 5). No node
	# of it is in the container.
	if [[ $lazy == 1 ]]; then dev+=', {"allow": true, "type": "c", "major": 10, "minor": 257, "access": "rw"}'; fi
	cat <<-JSON
		{
			"ociVersion": "1.0.2",
			"process": {
				"terminal": false, "user": {"uid": 0, "gid": 0},
				"args": ["/bin/sh", "-c", "nc -l -p 7000 & i=0; while :; do i=\$((i+1)); echo \$i >/tmp/n; sleep 0.1; done"],
				"env": ["PATH=/bin"], "cwd": "/", "noNewPrivileges": true
			},
			"root": {"path": "rootfs", "readonly": false},
			"hostname": "$CASE_ID",
			"hooks": {"createRuntime": [{"path": "$W/netns-hook"}]},
			"mounts": [
				{"destination": "/proc", "type": "proc", "source": "proc"},
				{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=1024k"]},
				{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
			],
			"linux": {
				$maps
				"cgroupsPath": "/$CASE_ID",
				"sysctl": {"net.mptcp.enabled": "0"},
				"resources": {"devices": [$dev]},
				"namespaces": [$ns {"type": "pid"}, {"type": "network"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}],
				"maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
				"readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
			}
		}
	JSON
}

R() { "$RUNC" --root "$CASE_DIR/runc" --log "$CASE_DIR/runc.log" "${RUNC_CRIU[@]}" "$@"; }
init_pid() { R state "$CASE_ID" 2>/dev/null | sed -n 's/^ *"pid": *\([0-9]*\).*/\1/p' | head -n1; }
# logms LOG: the last timestamp of a CRIU log in ms (CRIU's own time).
logms() {
	tail -n 1 "$1" 2>/dev/null | sed -n 's/^(\([0-9]*\)\.\([0-9]\{3\}\).*/\1\2/p' | sed 's/^0*\([0-9]\)/\1/'
}

# counter PID: the container's counter (read again if caught between the
# shell's truncate and write).
counter() {
	local v i
	for ((i = 0; i < 20; i++)); do
		v=$(cat "/proc/$1/root/tmp/n" 2>/dev/null)
		if [[ -n $v ]]; then
			echo "$v"
			return
		fi
		sleep 0.01
	done
}

# remap_userns_img IMG OLD NEW: lower_first OLD -> NEW in a CRIU userns
# image (a uid_gid_extent's field 2). Only where the varints are of one
# length, as here; a daemon would re-encode the entry.
remap_userns_img() {
	python3 - "$@" <<-'PY'
		import sys
		path, old, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
		def varint(n):
		    out = bytearray()
		    while True:
		        b, n = n & 0x7f, n >> 7
		        out.append(b | 0x80 if n else b)
		        if not n:
		            return bytes(out)
		o, n = b"\x10" + varint(old), b"\x10" + varint(new)
		assert len(o) == len(n), "varint lengths differ"
		data = open(path, "rb").read()
		assert data.count(o) == 2, "expected one uid and one gid extent"
		open(path, "wb").write(data.replace(o, n))
	PY
}

FAILED=0
fail() {
	echo "  FAIL $CASE_ID: $*"
	local f
	for f in "$CASE_DIR/work/restore.log" "$CASE_DIR/work/dump.log" "$CASE_DIR/work/lazy-pages.log"; do
		if [[ -f $f ]] && grep 'Error' "$f" | grep -qv RLIMIT_NOFILE; then
			echo "    ${f##*/}:"
			grep 'Error' "$f" | grep -v RLIMIT_NOFILE | head -n 4 | sed 's/^/      /'
		fi
	done
	FAILED=1
	return 1
}

# run_case NAME N
run_case() {
	local name=$1 n=$2 userns=0 lazy=0 cgns=0 nids=$IDS host=$HOSTID rhost=$HOSTID ovl=0
	case $name in
	plain-eager) ;;
	plain-lazy) lazy=1 ;;
	userns-eager) userns=1 ;;
	userns-lazy) userns=1 lazy=1 ;;
	userns-cgns) userns=1 cgns=1 nids=65534 ;;
	userns-remap) userns=1 rhost=$((HOSTID + 100000)) ;;
	userns-overlay) userns=1 ovl=1 ;;
	userns-overlay-lazy) userns=1 ovl=1 lazy=1 ;;
	*) echo "unknown case $name" >&2; return 2 ;;
	esac
	CASE_ID=userns-repro-$$-$name-$n
	CASE_DIR=$W/$name-$n
	mkdir -p "$CASE_DIR"/{bundle/rootfs,img,work,runc}
	chmod 755 "$CASE_DIR" "$CASE_DIR/bundle"
	rootfs "$CASE_DIR/lower"
	local written=$CASE_DIR/lower/tmp/n
	if [[ $ovl == 1 ]]; then
		# Both layers idmapped, the overlay mounted with the range's
		# root as its mounter (its upper-layer changes go through the
		# upper layer's idmap), the layer mounts then detached: overlayfs
		# holds its own clones of them.
		mkdir -p "$CASE_DIR"/{ml,mu,u/upper,u/work}
		written=$CASE_DIR/u/upper/tmp/n
		"$W/idmapmount" "$CASE_DIR/lower" "$CASE_DIR/ml" "$host" "$nids" &&
			"$W/idmapmount" "$CASE_DIR/u" "$CASE_DIR/mu" "$host" "$nids" &&
			"$W/ovlmount" "$host" "lowerdir=$CASE_DIR/ml,upperdir=$CASE_DIR/mu/upper,workdir=$CASE_DIR/mu/work" \
				"$CASE_DIR/bundle/rootfs" || { fail "idmapped overlay"; return; }
		umount "$CASE_DIR/ml" "$CASE_DIR/mu"
	elif [[ $userns == 1 ]]; then
		"$W/idmapmount" "$CASE_DIR/lower" "$CASE_DIR/bundle/rootfs" "$host" "$nids" || { fail "idmapped mount"; return; }
	else
		mount --bind "$CASE_DIR/lower" "$CASE_DIR/bundle/rootfs"
	fi
	spec $userns "$host" "$nids" $cgns $lazy >"$CASE_DIR/bundle/config.json"

	local t pid0 pid1 c0 c1 want line
	t=$(ms)
	R run -d --bundle "$CASE_DIR/bundle" "$CASE_ID" </dev/null >/dev/null 2>&1 || { fail "runc run: $(tail -n1 "$CASE_DIR/runc.log")"; return; }
	line="run $(($(ms) - t)) ms"
	sleep 0.5
	pid0=$(init_pid)
	c0=$(counter "$pid0")
	t=$(ms)
	R checkpoint --image-path "$CASE_DIR/img" --work-path "$CASE_DIR/work" "$CASE_ID" >/dev/null 2>&1 || { fail "runc checkpoint"; return; }
	line+=", checkpoint $(($(ms) - t)) ms (criu $(logms "$CASE_DIR/work/dump.log") ms)"
	if [[ $rhost != "$host" ]]; then
		umount "$CASE_DIR/bundle/rootfs"
		"$W/idmapmount" "$CASE_DIR/lower" "$CASE_DIR/bundle/rootfs" "$rhost" "$nids" || { fail "idmapped mount"; return; }
		sed -i "s/\"hostID\": $host,/\"hostID\": $rhost,/" "$CASE_DIR/bundle/config.json"
		remap_userns_img "$CASE_DIR"/img/userns-*.img "$host" "$rhost" || { fail "userns image"; return; }
	fi
	local lazyarg=()
	if [[ $lazy == 1 ]]; then
		"$CRIU" lazy-pages --images-dir "$CASE_DIR/img" --work-dir "$CASE_DIR/work" \
			--log-file lazy-pages.log -v4 </dev/null >/dev/null 2>&1 &
		LAZY_PID=$!
		for ((i = 0; i < 50; i++)); do
			[[ -S $CASE_DIR/work/lazy-pages.socket ]] && break
			sleep 0.02
		done
		lazyarg=(--lazy-pages)
	fi
	t=$(ms)
	R restore -d "${lazyarg[@]}" --bundle "$CASE_DIR/bundle" --image-path "$CASE_DIR/img" \
		--work-path "$CASE_DIR/work" "$CASE_ID" </dev/null >/dev/null 2>&1 || { fail "runc restore"; return; }
	line+=", restore $(($(ms) - t)) ms (criu $(logms "$CASE_DIR/work/restore.log") ms)"
	if [[ -n $LAZY_PID ]]; then
		wait "$LAZY_PID" || { LAZY_PID=""; fail "criu lazy-pages exited $?"; return; }
		LAZY_PID=""
		grep -q 'UFFD transferred pages' "$CASE_DIR/work/lazy-pages.log" || { fail "no page was served lazily"; return; }
		line+=", lazy-pages done"
	fi
	sleep 0.5
	pid1=$(init_pid)
	[[ -n $pid1 && -d /proc/$pid1 ]] || { fail "no container after the restore"; return; }
	c1=$(counter "$pid1")
	[[ -n $c0 && -n $c1 && $c1 -gt $c0 ]] || { fail "the counter did not go on ($c0 -> $c1)"; return; }
	cat "/proc/$pid1/net/tcp" "/proc/$pid1/net/tcp6" 2>/dev/null | grep -q ':1B58 0*:0000 0A' || { fail "the TCP listener is gone"; return; }
	nsenter -t "$pid1" -n ip -o link show lo | grep -q '[<,]UP[,>]' || { fail "lo is down in the restored network namespace"; return; }
	if [[ -e /proc/sys/net/mptcp/enabled && $(nsenter -t "$pid1" -n cat /proc/sys/net/mptcp/enabled) != 0 ]]; then
		fail "MPTCP is on in the restored network namespace"
		return
	fi
	if [[ $userns == 1 ]]; then
		want="0 $rhost $nids"
		[[ $(tr -s ' ' <"/proc/$pid1/uid_map" | sed 's/^ //') == "$want" ]] || { fail "uid_map is '$(tr -s ' ' <"/proc/$pid1/uid_map")', not '$want'"; return; }
		[[ $(awk '/^Uid:/ {print $2}' "/proc/$pid1/status") == "$rhost" ]] || { fail "the init is not host uid $rhost"; return; }
		[[ $(stat -c %u "$written") == 0 ]] || { fail "the rootfs got host ids on disk"; return; }
		if [[ $ovl == 1 && -e $CASE_DIR/lower/tmp/n ]]; then
			fail "the unit wrote in the lower layer"
			return
		fi
	fi
	if [[ $cgns == 1 ]]; then
		[[ $(nsenter -t "$pid1" --cgroup cat "/proc/$pid1/cgroup" | grep -c ':/$') -gt 0 ]] || { fail "the cgroup namespace's root is not the container's cgroup"; return; }
	fi
	echo "  PASS $name: $line; counter $c0 -> $c1"
}

CASES=("$@")
[[ ${#CASES[@]} -gt 0 ]] || CASES=(plain-eager plain-lazy userns-eager userns-lazy userns-cgns userns-remap userns-overlay userns-overlay-lazy)
echo "criu: $CRIU ($("$CRIU" --version | head -n1)); runc: $RUNC ($("$RUNC" --version | head -n1)); kernel $(uname -r)"
for ((n = 1; n <= REPEAT; n++)); do
	for c in "${CASES[@]}"; do
		run_case "$c" "$n"
		cleanup_case
	done
done
exit $FAILED
