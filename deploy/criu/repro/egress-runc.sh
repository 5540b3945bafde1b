#!/usr/bin/env bash
# deploy/criu/repro/egress-runc.sh - an established TCP connection from a
# runc container in a user namespace to an outside server, through a veth
# link and the host's address translation, across a checkpoint and a
# restore on the same host (docs/notes/egress.md).
#
# Three network namespaces of the script's own: "host" (the link's host
# side, forwarding, masquerade), "world" (a server sending a counter line
# every 0.2 s on one connection, 192.0.2.2) and the container's, which runc
# makes inside the container's user namespace. A createRuntime hook makes
# the veth pair: runc runs it at create and again at CRIU's
# setup-namespaces during the restore (runc restores with --empty-ns net),
# before CRIU restores the socket; it sets the same addresses both times
# (10.255.255.2/30, gateway .1).
#
# Usage: egress-runc.sh      Environment: CRIU, RUNC (default: on PATH),
# HOSTID (default 300000), GAP (seconds parked, default 2).
# Prints the counter lines the container had before and after; PASS if the
# connection goes on after the restore. Needs root, gcc, busybox-static.
# Leaves nothing behind: container, mounts, cgroups, namespaces.
# The `ip` and `nft` tools here are the reproduction's; the daemon's
# package (internal/egress) does the same over netlink.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CRIU=${CRIU:-$(command -v criu || true)}
RUNC=${RUNC:-$(command -v runc || true)}
HOSTID=${HOSTID:-300000}
GAP=${GAP:-2}
IDS=65536
[[ $(id -u) -eq 0 ]] || { echo "must run as root" >&2; exit 2; }
[[ -x $CRIU && -x $RUNC ]] || { echo "need CRIU and RUNC (got '$CRIU', '$RUNC')" >&2; exit 2; }
[[ -x /bin/busybox ]] || { echo "need busybox-static (/bin/busybox)" >&2; exit 2; }

W=$(mktemp -d /tmp/egress-repro.XXXXXX)
chmod 755 "$W"
ID=egress-repro-$$
H=egress-repro-host-$$
WO=egress-repro-world-$$
SRV=""
cleanup() {
	"$RUNC" --root "$W/runc" delete -f "$ID" >/dev/null 2>&1
	umount -l "$W/bundle/rootfs" 2>/dev/null
	local c
	for c in /sys/fs/cgroup/*/"$ID" /sys/fs/cgroup/"$ID"; do
		if [[ -d $c ]]; then rmdir "$c" 2>/dev/null; fi
	done
	if [[ -n $SRV ]]; then kill "$SRV" 2>/dev/null; fi
	ip netns pids "$WO" 2>/dev/null | xargs -r kill 2>/dev/null
	ip netns del "$H" 2>/dev/null
	ip netns del "$WO" 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$H" && ip netns add "$WO" || exit 2
ip -n "$H" link add up0 type veth peer name wo0 netns "$WO"
ip -n "$H" addr add 192.0.2.1/24 dev up0
ip -n "$H" link set up0 up
ip -n "$WO" addr add 192.0.2.2/24 dev wo0
ip -n "$WO" link set wo0 up
ip -n "$WO" link set lo up
ip netns exec "$H" sysctl -qw net.ipv4.ip_forward=1
ip netns exec "$H" nft -f - <<-'NFT' || exit 2
	table ip repro {
		chain post {
			type nat hook postrouting priority srcnat; policy accept;
			iifname "rrde1" masquerade
		}
	}
NFT

gcc -O2 -Wall -o "$W/idmapmount" "$HERE/idmapmount.c" || exit 2
# The hook: the link, made afresh each time (a namespace being torn down
# may still hold the old one for a moment after the checkpoint).
cat >"$W/hook" <<HOOK
#!/bin/sh
pid=\$(tr -d '\n' | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
[ -n "\$pid" ] || exit 1
ip -n $H link del rrde1 2>/dev/null
ip -n $H link add rrde1 type veth peer name eth0 netns "\$pid" || exit 1
ip -n $H addr add 10.255.255.1/30 dev rrde1 && ip -n $H link set rrde1 up || exit 1
nsenter -t "\$pid" -n sh -c 'ip link set lo up && ip addr add 10.255.255.2/30 dev eth0 &&
	ip link set eth0 up && ip route add default via 10.255.255.1 &&
	{ [ ! -e /proc/sys/net/mptcp/enabled ] || echo 0 >/proc/sys/net/mptcp/enabled; }'
HOOK
chmod 755 "$W/hook"
mkdir -p "$W"/{lower/bin,lower/proc,lower/dev,lower/sys,lower/tmp,bundle/rootfs,img,work,runc,bin}
cp /bin/busybox "$W/lower/bin/busybox"
for i in sh sleep nc; do ln -s busybox "$W/lower/bin/$i"; done
"$W/idmapmount" "$W/lower" "$W/bundle/rootfs" "$HOSTID" "$IDS" || exit 2
printf 'tcp-established\nnetwork-lock nftables\n' >"$W/criu.conf"
chmod 644 "$W/criu.conf"
cat >"$W/bundle/config.json" <<JSON
{
	"ociVersion": "1.0.2",
	"process": {
		"terminal": false, "user": {"uid": 0, "gid": 0},
		"args": ["/bin/sh", "-c", "sleep 100000 | nc 192.0.2.2 8080 >/tmp/got"],
		"env": ["PATH=/bin"], "cwd": "/", "noNewPrivileges": true
	},
	"root": {"path": "rootfs"},
	"hostname": "$ID",
	"annotations": {"org.criu.config": "$W/criu.conf"},
	"hooks": {"createRuntime": [{"path": "$W/hook"}]},
	"mounts": [
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755", "size=1024k"]},
		{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
	],
	"linux": {
		"uidMappings": [{"containerID": 0, "hostID": $HOSTID, "size": $IDS}],
		"gidMappings": [{"containerID": 0, "hostID": $HOSTID, "size": $IDS}],
		"cgroupsPath": "/$ID",
		"resources": {"devices": [{"allow": false, "access": "rwm"}]},
		"namespaces": [{"type": "user"}, {"type": "pid"}, {"type": "network"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}]
	}
}
JSON
ln -s "$CRIU" "$W/bin/criu" # runc runs the criu on PATH
export PATH="$W/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

ip netns exec "$WO" sh -c 'i=0; while :; do echo $i; i=$((i+1)); sleep 0.2; done | busybox nc -l -p 8080' &
SRV=$!
sleep 0.3
R() { "$RUNC" --root "$W/runc" --log "$W/runc.log" "$@"; }
pidof_c() { R state "$ID" 2>/dev/null | sed -n 's/^ *"pid": *\([0-9]*\).*/\1/p' | head -n1; }
lines() { wc -l <"/proc/$1/root/tmp/got"; }

R run -d --bundle "$W/bundle" "$ID" </dev/null >/dev/null 2>&1 || { echo "FAIL runc run: $(tail -n1 "$W/runc.log")"; exit 1; }
sleep 1.5
c0=$(lines "$(pidof_c)")
R checkpoint --tcp-established --image-path "$W/img" --work-path "$W/work" "$ID" ||
	{ echo "FAIL checkpoint"; grep Error "$W/work/dump.log" | head -n 4; exit 1; }
sleep "$GAP"
R restore -d --tcp-established --bundle "$W/bundle" --image-path "$W/img" --work-path "$W/work" "$ID" </dev/null >/dev/null 2>&1 ||
	{ echo "FAIL restore"; grep Error "$W/work/restore.log" | grep -v RLIMIT | head -n 4; exit 1; }
sleep 1
pid=$(pidof_c)
c1=$(lines "$pid")
sleep 1
c2=$(lines "$pid")
echo "counter lines: $c0 before the checkpoint, $c1 one second after the restore, $c2 a second later"
if [[ $c1 -gt $c0 && $c2 -gt $c1 ]]; then echo PASS; else echo FAIL; exit 1; fi
