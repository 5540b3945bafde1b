#!/usr/bin/env bash
# deploy/setup.sh - prepare a Debian 12 host to run runrecordd.
#
# Builds the container runtime (containerd 2.3 LTS, its runc shim, ctr and
# runc) from the module deploy/runtime, whose go.mod and go.sum pin it, and
# installs it; installs iptables, nftables, iproute2 and busybox-static from
# Debian, and makes sure a CRIU >= 4.2.1 that passes `criu check` is on PATH
# (building CRIU 4.2.1 from the source tarball vendored in deploy/criu, with
# the patches there, when needed, and recording the build in
# /usr/local/share/runrecordd/criu.json for the daemon). Then
# it probes that CRIU really can dump and restore here: a throwaway process,
# and a throwaway runc container, each step under a deadline. Idempotent: a
# rerun on a host that is already set up installs nothing, downloads nothing
# and builds nothing (the probe runs every time; it takes a few seconds).
# See docs/setup.md.
#
# Run as root, non-interactively (works with no stdin, as in CI).
# Environment knobs:
#   RUNRECORDD_CACHE_DIR   cache root (default /var/cache/runrecordd)
#   RUNRECORDD_CRIU_FORCE_BUILD=1   rebuild CRIU even if a good one exists
#   RUNRECORDD_REQUIRE_IMAGE_PARKS=1   exit non-zero when the probe fails
#                          (default: warn and exit 0; transcript runs still work)
#   RUNRECORDD_PROBE_TIMEOUT   deadline of each probe step in seconds (default 60)
#   RUNRECORDD_CRIU        probe this criu binary instead of the installed one
#   RUNRECORDD_RUNTIME_PREFIX   where containerd, containerd-shim-runc-v2,
#                          ctr and runc are installed (default /usr/local/bin);
#                          the probe and the summary use the ones there
set -Eeuo pipefail

readonly CRIU_VERSION=4.2.1
# Oldest CRIU accepted on PATH. 4.1.1 passes `criu check` on AMD EPYC VMs but
# hangs in every dump, and cannot dump TCP sockets on our 6.18 kernel.
readonly CRIU_MIN_VERSION=4.2.1
readonly CRIU_ORIG=criu_${CRIU_VERSION}.orig.tar.xz
readonly CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
readonly CRIU_PREFIX=/usr/local/sbin
readonly CRIU_BIN=${CRIU_PREFIX}/criu
readonly CACHE_ROOT=${RUNRECORDD_CACHE_DIR:-/var/cache/runrecordd}
readonly CRIU_CACHE=${CACHE_ROOT}/criu-${CRIU_VERSION}
# Patches applied to the CRIU this script builds (deploy/criu/*.patch, in
# name order); the build records their sha256 in CRIU_CACHE/criu.patches,
# and an installed build with other patches is rebuilt.
readonly CRIU_PATCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/criu
# The source tarball, vendored beside the patches (pinned by CRIU_SHA256):
# Debian's archive drops a version once no suite carries it. apt-get source
# from sid is the fallback for a checkout without it.
readonly CRIU_VENDORED=$CRIU_PATCH_DIR/$CRIU_ORIG
# The manifest of the build installed at CRIU_BIN, read by the daemon
# (internal/criu; docs/setup.md, "The CRIU build").
readonly CRIU_MANIFEST=/usr/local/share/runrecordd/criu.json
# Where the CRIU this script builds keeps its kernel-feature cache
# (criu.kdat; CRIU's RUNDIR, /run by default). CRIU keeps it only on a
# tmpfs, and probes the kernel afresh, 50-75 ms, in every run without it:
# where /run is not a tmpfs, every dump, restore and lazy-pages paid that.
# A small tmpfs, root's alone, is mounted here (docs/setup.md).
readonly CRIU_RUNDIR=/run/runrecordd-criu
readonly DEBIAN_SOURCES=/etc/apt/sources.list.d/debian.sources
readonly SID_SRC_LIST=/etc/apt/sources.list.d/runrecordd-sid-src.sources
readonly ARCHIVE_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# Left by earlier versions of this script (CRIU 4.1.1 from trixie).
readonly OLD_TRIXIE_SRC_LIST=/etc/apt/sources.list.d/runrecordd-trixie-src.sources
readonly PROBE_TIMEOUT=${RUNRECORDD_PROBE_TIMEOUT:-60}
readonly PROBE_LOGS=${CACHE_ROOT}/probe-logs

# Packages (Debian bookworm) the runtime needs beside it. CRIU runs `ip`
# (iproute2) and iptables-restore to dump and restore a network namespace
# (and to unlock a park dumped with its iptables network lock); the executor
# clears a killed dump's nftables lock with `nft` (nftables); busybox-static
# is the whole root filesystem of the probe's throwaway container. libseccomp2
# is what the runc built here links (it compiles the spec's seccomp filter).
# systemd: its systemd-analyze verifies the shipped unit file (e2e TestSystemdUnit);
# the daemon needs no systemd as PID 1.
readonly RUNTIME_PKGS=(iptables nftables iproute2 busybox-static libseccomp2 xz-utils ca-certificates systemd)

# The container runtime: built from the Go module deploy/runtime, whose
# go.mod and go.sum pin containerd (2.3, the LTS line), its runc shim, ctr and
# runc; Debian 12's containerd 1.6 is past its end of life and its runc 1.1
# has no idmapped mounts (docs/setup.md). The build is cached under
# RUNTIME_CACHE by a hash of go.mod, go.sum, the build settings below and
# the Go version, so a rerun builds nothing.
readonly RUNTIME_MODULE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/runtime
readonly RUNTIME_PREFIX=${RUNRECORDD_RUNTIME_PREFIX:-/usr/local/bin}
readonly RUNTIME_CACHE=${CACHE_ROOT}/runtime
readonly RUNTIME_BINS=(containerd containerd-shim-runc-v2 ctr runc)
# runc needs cgo and libseccomp's headers (its `seccomp` build tag).
readonly RUNTIME_BUILD_PKGS=(gcc libc6-dev pkg-config libseccomp-dev)
# Build tags, as upstream's Makefiles set them, less what this host has no
# use for: runc without `libpathrs` (a Rust library Debian 12 does not
# ship; runc then uses its Go implementation); containerd without the btrfs
# snapshotter (no_btrfs: no btrfs headers needed; the daemon runs overlayfs).
readonly RUNC_TAGS="seccomp urfave_cli_no_docs"
readonly CONTAINERD_TAGS="urfave_cli_no_docs no_btrfs"
readonly SHIM_TAGS="urfave_cli_no_docs no_grpc"
# Build dependencies for `make criu` (bookworm versions are fine).
readonly CRIU_BUILD_PKGS=(
	gcc make pkg-config
	libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-protobuf
	libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev
	libnftables-dev uuid-dev zlib1g-dev patch
)

export DEBIAN_FRONTEND=noninteractive
# A sane PATH for the tools we run ourselves (the caller's PATH may put
# pyenv, cargo, ... first). /usr/local/sbin precedes /usr/sbin on purpose.
readonly SYS_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

START_TS=$(date +%s)
readonly CALLER_PATH=$PATH

log() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }
die() {
	printf 'setup: ERROR: %s\n' "$*" >&2
	exit 1
}
trap 'rc=$?; printf "setup: ERROR: command failed (exit %s) at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND" >&2' ERR

[[ $(id -u) -eq 0 ]] || die "must run as root (uid is $(id -u)); try: sudo $0"
if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
	die "apt-get/dpkg-query not found: this script supports Debian only"
fi

# ---------------------------------------------------------------- apt helpers

APT_UPDATED=0
apt_update() {
	# Runs at most once per run unless forced (after adding a source).
	if [[ $APT_UPDATED -eq 1 && ${1:-} != force ]]; then
		return 0
	fi
	log "apt-get update ..."
	mkdir -p "$CACHE_ROOT"
	if ! apt-get update </dev/null >"$CACHE_ROOT/apt-update.log" 2>&1; then
		tail -n 20 "$CACHE_ROOT/apt-update.log" >&2 || true
		die "apt-get update failed; log: $CACHE_ROOT/apt-update.log"
	fi
	APT_UPDATED=1
}

pkg_installed() {
	[[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null) == ii* ]]
}

pkg_version() {
	dpkg-query -W -f='${Version}' "$1" 2>/dev/null
}

# ensure_pkgs [--quiet] PKG... : install those not installed yet.
ensure_pkgs() {
	local quiet=0
	if [[ ${1:-} == --quiet ]]; then
		quiet=1
		shift
	fi
	local missing=() p
	for p in "$@"; do
		if pkg_installed "$p"; then
			[[ $quiet -eq 1 ]] || log "$p $(pkg_version "$p") already installed"
		else
			missing+=("$p")
		fi
	done
	[[ ${#missing[@]} -gt 0 ]] || return 0
	apt_update
	log "installing: ${missing[*]}"
	if ! apt-get install -y --no-install-recommends \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		"${missing[@]}" </dev/null >"$CACHE_ROOT/apt-install.log" 2>&1; then
		tail -n 20 "$CACHE_ROOT/apt-install.log" >&2 || true
		die "apt-get install ${missing[*]} failed; log: $CACHE_ROOT/apt-install.log"
	fi
	for p in "${missing[@]}"; do
		pkg_installed "$p" || die "package $p still not installed after apt-get install"
		log "$p $(pkg_version "$p") installed"
	done
}

# ---------------------------------------------------------------- criu helpers

# criu_version BIN -> prints e.g. 4.2.1 (empty if unknown or if BIN hangs)
criu_version() {
	timeout --kill-after=5 10 "$1" --version </dev/null 2>/dev/null |
		sed -n 's/^Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1 || true
}

# criu_new_enough VERSION : true if VERSION >= CRIU_MIN_VERSION.
criu_new_enough() {
	[[ -n $1 ]] && dpkg --compare-versions "$1" ge "$CRIU_MIN_VERSION"
}

# criu_check BIN : run `criu check` under a deadline; prints its output.
# True only if it finished in time, exited 0 and said "Looks good".
criu_check() {
	local out rc=0
	out=$(timeout --kill-after=5 "$PROBE_TIMEOUT" "$1" check </dev/null 2>&1) || rc=$?
	printf '%s\n' "$out"
	if [[ $rc -eq 124 || $rc -eq 137 ]]; then
		printf 'criu check did not finish within %ss (killed)\n' "$PROBE_TIMEOUT"
		return 1
	fi
	[[ $rc -eq 0 ]] && grep -q 'Looks good' <<<"$out"
}

# criu_good BIN : true if BIN exists, is >= CRIU_MIN_VERSION and
# `criu check` says Looks good.
CRIU_CHECKED=""   # the last binary criu_good passed, and its check output
CRIU_CHECK_OUT=""
criu_good() {
	local bin=$1 ver out
	[[ -x $bin ]] || return 1
	ver=$(criu_version "$bin")
	criu_new_enough "$ver" || return 1
	out=$(criu_check "$bin") || return 1
	CRIU_CHECKED=$bin
	CRIU_CHECK_OUT=$out
}

# Print the mirror URI serving bookworm, read from the deb822 sources file
# (falls back to a one-line entry in /etc/apt/sources.list).
debian_mirror_uri() {
	local uri=""
	if [[ -r $DEBIAN_SOURCES ]]; then
		uri=$(awk '
			function flush() {
				if (uris != "" && types ~ /(^| )deb( |$)/ && suites ~ /(^| )bookworm( |$)/ && found == "")
					found = uris
				types = ""; suites = ""; uris = ""
			}
			/^[[:space:]]*$/ { flush(); next }
			/^[[:space:]]*#/ { next }
			tolower($1) == "types:"  { $1 = ""; types = $0 " " }
			tolower($1) == "suites:" { $1 = ""; suites = $0 " " }
			tolower($1) == "uris:"   { uris = $2 }
			END { flush(); print found }
		' "$DEBIAN_SOURCES")
	fi
	if [[ -z $uri && -r /etc/apt/sources.list ]]; then
		uri=$(awk '$1 == "deb" && $0 ~ / bookworm / {
				for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit }
			}' /etc/apt/sources.list)
	fi
	[[ -n $uri ]] || die "could not find a bookworm mirror URI in $DEBIAN_SOURCES or /etc/apt/sources.list"
	printf '%s\n' "${uri%/}"
}

ensure_sid_src() {
	local uri want
	uri=$(debian_mirror_uri)
	want=$(printf 'Types: deb-src\nURIs: %s\nSuites: sid\nComponents: main\nSigned-By: %s\n' \
		"$uri" "$ARCHIVE_KEYRING")
	if [[ -f $SID_SRC_LIST && $(<"$SID_SRC_LIST") == "$want" ]]; then
		log "sid deb-src entry already present ($SID_SRC_LIST)"
		apt_update
	else
		log "adding sid deb-src entry ($SID_SRC_LIST, mirror from $DEBIAN_SOURCES)"
		printf '%s\n' "$want" >"$SID_SRC_LIST"
		apt_update force
	fi
}

sha256_ok() {
	[[ -f $1 ]] && [[ $(sha256sum "$1" | awk '{print $1}') == "$CRIU_SHA256" ]]
}

fetch_criu_orig() {
	local dl=$CRIU_CACHE/download tarball=$CRIU_CACHE/$CRIU_ORIG
	if sha256_ok "$tarball"; then
		log "$CRIU_ORIG cached, sha256 ok"
		return 0
	fi
	if sha256_ok "$CRIU_VENDORED"; then
		install -m 0644 "$CRIU_VENDORED" "$tarball"
		log "$CRIU_ORIG from $CRIU_VENDORED, sha256 ok"
		return 0
	elif [[ -e $CRIU_VENDORED ]]; then
		die "$CRIU_VENDORED does not hash to $CRIU_SHA256"
	fi
	log "$CRIU_VENDORED is missing; falling back to Debian's sid source"
	ensure_sid_src
	rm -rf "$dl"
	mkdir -p "$dl"
	# Let apt's unprivileged _apt user write here (avoids the sandbox warning).
	if id _apt >/dev/null 2>&1; then chown _apt "$dl"; fi
	log "downloading criu/sid source (apt-get source --download-only) ..."
	local rc=0
	(cd "$dl" && apt-get source -qq --download-only "criu/sid" </dev/null >"$CRIU_CACHE/download.log" 2>&1) || rc=$?
	if [[ ! -f $dl/$CRIU_ORIG ]]; then
		tail -n 20 "$CRIU_CACHE/download.log" >&2 || true
		die "apt-get source criu/sid (exit $rc) did not fetch $CRIU_ORIG; log: $CRIU_CACHE/download.log"
	fi
	if [[ $rc -ne 0 ]]; then
		log "apt-get source exited $rc but $CRIU_ORIG arrived (the .dsc may be missing on the mirror); continuing"
	fi
	if ! sha256_ok "$dl/$CRIU_ORIG"; then
		local got
		got=$(sha256sum "$dl/$CRIU_ORIG" | awk '{print $1}')
		mv -f "$dl/$CRIU_ORIG" "$CRIU_CACHE/$CRIU_ORIG.bad"
		rm -rf "$dl"
		die "sha256 mismatch for $CRIU_ORIG: got $got, want $CRIU_SHA256 (kept as $CRIU_CACHE/$CRIU_ORIG.bad)"
	fi
	mv -f "$dl/$CRIU_ORIG" "$tarball"
	rm -rf "$dl"
	log "$CRIU_ORIG downloaded, sha256 ok"
}

# criu_patches_id : the sha256 of deploy/criu/*.patch, in name order, and
# of the build's settings.
criu_patches_id() {
	local p
	{
		for p in "$CRIU_PATCH_DIR"/*.patch; do
			[[ -f $p ]] && cat "$p"
		done
		echo "RUNDIR=$CRIU_RUNDIR"
	} | sha256sum | awk '{print $1}'
}

# ensure_criu_rundir : CRIU_RUNDIR a tmpfs only root can write, for the
# installed build's kernel-feature cache. Without it CRIU still runs, only
# probing the kernel each time.
ensure_criu_rundir() {
	if [[ -L $CRIU_RUNDIR || (-e $CRIU_RUNDIR && ! -d $CRIU_RUNDIR) ]]; then
		die "$CRIU_RUNDIR is not a directory"
	fi
	install -d -m 0700 -o root -g root "$CRIU_RUNDIR"
	# Always a tmpfs of its own, mounted over the path: nothing that was
	# in the directory before is read.
	if ! mountpoint -q "$CRIU_RUNDIR"; then
		mount -t tmpfs -o size=1m,mode=0700,nosuid,nodev,noexec runrecordd-criu "$CRIU_RUNDIR" ||
			{ warn "could not mount a tmpfs on $CRIU_RUNDIR: CRIU will probe the kernel in every run"; return 0; }
	fi
	log "CRIU's kernel-feature cache: $CRIU_RUNDIR (tmpfs)"
}

# criu_current BIN : false if BIN is this script's installed build and was
# not built with today's patches (another CRIU is taken as it is).
criu_current() {
	[[ $1 != "$CRIU_BIN" ]] && return 0
	[[ -x $CRIU_CACHE/criu ]] && cmp -s "$1" "$CRIU_CACHE/criu" &&
		[[ $(cat "$CRIU_CACHE/criu.patches" 2>/dev/null) == "$(criu_patches_id)" ]]
}

build_criu() {
	local src=$CRIU_CACHE/src/criu-$CRIU_VERSION log_file=$CRIU_CACHE/build.log p id
	log "building CRIU $CRIU_VERSION from source (log: $log_file) ..."
	ensure_pkgs --quiet "${CRIU_BUILD_PKGS[@]}"
	fetch_criu_orig
	id=$(criu_patches_id)
	if [[ ! -f $src/.extracted || $(cat "$src/.extracted") != "$id" ]]; then
		rm -rf "$CRIU_CACHE/src" "$CRIU_CACHE/src.tmp"
		mkdir -p "$CRIU_CACHE/src.tmp"
		tar -C "$CRIU_CACHE/src.tmp" -xJf "$CRIU_CACHE/$CRIU_ORIG"
		[[ -d $CRIU_CACHE/src.tmp/criu-$CRIU_VERSION ]] ||
			die "unexpected layout in $CRIU_ORIG (no criu-$CRIU_VERSION/ directory)"
		for p in "$CRIU_PATCH_DIR"/*.patch; do
			[[ -f $p ]] || continue
			patch -d "$CRIU_CACHE/src.tmp/criu-$CRIU_VERSION" -p1 --batch --forward --fuzz=0 --quiet <"$p" >>"$log_file" 2>&1 ||
				die "applying $p to CRIU $CRIU_VERSION failed; log: $log_file"
			log "applied $(basename "$p")"
		done
		echo "$id" >"$CRIU_CACHE/src.tmp/criu-$CRIU_VERSION/.extracted"
		mv "$CRIU_CACHE/src.tmp" "$CRIU_CACHE/src"
	fi
	local t0=$SECONDS
	if ! (cd "$src" && PATH=$SYS_PATH make -j2 RUNDIR="$CRIU_RUNDIR" criu </dev/null >"$log_file" 2>&1); then
		tail -n 30 "$log_file" >&2 || true
		die "make criu failed; full log: $log_file"
	fi
	[[ -x $src/criu/criu ]] || die "make criu succeeded but $src/criu/criu is missing"
	install -m 0755 "$src/criu/criu" "$CRIU_CACHE/criu"
	echo "$id" >"$CRIU_CACHE/criu.patches"
	log "built CRIU $CRIU_VERSION in $((SECONDS - t0))s"
}

install_cached_criu() {
	install -d -m 0755 "$CRIU_PREFIX"
	install -m 0755 "$CRIU_CACHE/criu" "$CRIU_BIN"
	log "installed $CRIU_BIN ($(criu_version "$CRIU_BIN"))"
}

# sha256_of FILE -> its sha256 in hex
sha256_of() {
	sha256sum "$1" | awk '{print $1}'
}

# install_criu_manifest : record the build at CRIU_BIN in CRIU_MANIFEST
# (JSON: version, source tarball, each patch in the order applied, the
# binary; each by sha256). Called only once CRIU_BIN is known to be this
# script's build with today's patches (criu_current).
install_criu_manifest() {
	local p name tmp=$CRIU_MANIFEST.tmp.$$ sep=""
	install -d -m 0755 "$(dirname "$CRIU_MANIFEST")"
	{
		printf '{\n  "version": "%s",\n  "binary": "%s",\n  "binary_sha256": "%s",\n' \
			"$CRIU_VERSION" "$CRIU_BIN" "$(sha256_of "$CRIU_BIN")"
		printf '  "source": {"name": "%s", "sha256": "%s"},\n' "$CRIU_ORIG" "$CRIU_SHA256"
		printf '  "rundir": "%s",\n  "patches": [' "$CRIU_RUNDIR"
		for p in "$CRIU_PATCH_DIR"/*.patch; do
			[[ -f $p ]] || continue
			name=$(basename "$p")
			[[ $name =~ ^[0-9]{1,3}-[A-Za-z0-9._-]+\.patch$ ]] || die "patch name $name: want N-name.patch"
			printf '%s\n    {"name": "%s", "sha256": "%s"}' "$sep" "$name" "$(sha256_of "$p")"
			sep=,
		done
		printf '\n  ]\n}\n'
	} >"$tmp" || die "writing $CRIU_MANIFEST"
	chmod 0644 "$tmp"
	mv -f "$tmp" "$CRIU_MANIFEST"
	log "recorded the CRIU build in $CRIU_MANIFEST"
}

ensure_criu() {
	local cur ver
	cur=$(PATH=$SYS_PATH command -v criu || true)
	if [[ ${RUNRECORDD_CRIU_FORCE_BUILD:-0} != 1 && -n $cur ]] && criu_good "$cur" && criu_current "$cur"; then
		log "criu $(criu_version "$cur") at $cur already passes criu check"
		if [[ $cur == "$CRIU_BIN" ]]; then
			install_criu_manifest
		else
			warn "criu at $cur is not this script's build: the daemon finds no build manifest for it and turns off the fast paths that need a deploy/criu patch (docs/setup.md, \"The CRIU build\"); RUNRECORDD_CRIU_FORCE_BUILD=1 builds and installs one at $CRIU_BIN"
		fi
		return 0
	fi
	if [[ -z $cur ]]; then
		log "criu not found"
	elif ! criu_current "$cur"; then
		log "criu at $cur was built without today's deploy/criu patches"
	else
		ver=$(criu_version "$cur")
		if ! criu_new_enough "$ver"; then
			log "criu at $cur is version ${ver:-unknown} (need >= $CRIU_MIN_VERSION)"
		elif [[ ${RUNRECORDD_CRIU_FORCE_BUILD:-0} == 1 ]]; then
			log "criu $ver at $cur; rebuilding anyway (RUNRECORDD_CRIU_FORCE_BUILD=1)"
		else
			log "criu $ver at $cur fails criu check"
		fi
	fi
	mkdir -p "$CRIU_CACHE"
	if [[ ${RUNRECORDD_CRIU_FORCE_BUILD:-0} != 1 && -x $CRIU_CACHE/criu ]] && criu_good "$CRIU_CACHE/criu" &&
		[[ $(cat "$CRIU_CACHE/criu.patches" 2>/dev/null) == "$(criu_patches_id)" ]]; then
		log "using cached CRIU $CRIU_VERSION build ($CRIU_CACHE/criu)"
	else
		build_criu
	fi
	install_cached_criu
	install_criu_manifest
}

drop_old_trixie_src() {
	if [[ -f $OLD_TRIXIE_SRC_LIST ]]; then
		rm -f "$OLD_TRIXIE_SRC_LIST"
		log "removed the trixie deb-src entry of an earlier setup ($OLD_TRIXIE_SRC_LIST)"
	fi
}

# ---------------------------------------------------------------- runtime

# first_line CMD... -> the first line CMD prints (stdout and stderr)
first_line() {
	"$@" 2>&1 </dev/null | sed -n 1p || true
}

# runtime_go -> the go command that builds the runtime (the caller's PATH,
# then Go's default install directory)
runtime_go() {
	local g
	g=$(command -v go || true)
	if [[ -z $g && -x /usr/local/go/bin/go ]]; then g=/usr/local/go/bin/go; fi
	[[ -n $g ]] || die "go not found on PATH (nor /usr/local/go/bin/go): the runtime is built from $RUNTIME_MODULE with Go >= $(sed -n 's/^go //p' "$RUNTIME_MODULE/go.mod")"
	printf '%s\n' "$g"
}

# runtime_module_version GO MODULE -> the version go.mod pins, e.g. v2.3.7
runtime_module_version() {
	GOWORK=off GOFLAGS=-mod=readonly GOTOOLCHAIN=local "$1" -C "$RUNTIME_MODULE" list -m -f '{{.Version}}' "$2"
}

# runtime_build_id GO -> the sha256 of what decides the build: go.mod,
# go.sum, the tags and flags runtime_build passes, and the Go version.
runtime_build_id() {
	{
		cat "$RUNTIME_MODULE/go.mod" "$RUNTIME_MODULE/go.sum"
		echo "runc=$RUNC_TAGS containerd=$CONTAINERD_TAGS shim=$SHIM_TAGS pie-runc cgo-containerd"
		GOTOOLCHAIN=local "$1" version
	} | sha256sum | awk '{print $1}'
}

# runtime_build GO DIR : build the four binaries into DIR.
runtime_build() {
	local g=$1 out=$2 log_file=$RUNTIME_CACHE/build.log t0=$SECONDS cv rv ld
	log "building containerd, its shim, ctr and runc from $RUNTIME_MODULE (log: $log_file) ..."
	ensure_pkgs --quiet "${RUNTIME_BUILD_PKGS[@]}"
	cv=$(runtime_module_version "$g" github.com/containerd/containerd/v2) || die "go list in $RUNTIME_MODULE failed"
	rv=$(runtime_module_version "$g" github.com/opencontainers/runc) || die "go list in $RUNTIME_MODULE failed"
	# What upstream's Makefiles stamp: containerd's version (`containerd
	# --version`, the Version API), runc's commit (its version is the
	# VERSION file it embeds); here both the module's version.
	ld="-X github.com/containerd/containerd/v2/version.Version=$cv"
	rm -rf "$out"
	mkdir -p "$out"
	if ! (
		cd "$RUNTIME_MODULE"
		export GOWORK=off GOFLAGS=-mod=readonly GOTOOLCHAIN=local PATH=$SYS_PATH
		set -x
		CGO_ENABLED=1 "$g" build -trimpath -buildmode=pie -tags "$RUNC_TAGS" \
			-ldflags "-X main.gitCommit=$rv" -o "$out/runc" github.com/opencontainers/runc
		CGO_ENABLED=0 "$g" build -trimpath -tags "$SHIM_TAGS" -ldflags "$ld" \
			-o "$out/containerd-shim-runc-v2" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
		CGO_ENABLED=1 "$g" build -trimpath -tags "$CONTAINERD_TAGS" -ldflags "$ld" \
			-o "$out/containerd" github.com/containerd/containerd/v2/cmd/containerd
		CGO_ENABLED=0 "$g" build -trimpath -tags "$CONTAINERD_TAGS" -ldflags "$ld" \
			-o "$out/ctr" github.com/containerd/containerd/v2/cmd/ctr
	) </dev/null >"$log_file" 2>&1; then
		tail -n 30 "$log_file" >&2 || true
		die "building the runtime failed; full log: $log_file"
	fi
	log "built containerd $cv and runc $rv in $((SECONDS - t0))s"
}

# ensure_runtime : the runtime built (or found in the cache) and installed
# in RUNTIME_PREFIX; other builds in the cache are removed.
ensure_runtime() {
	local g id dir b d
	g=$(runtime_go)
	id=$(runtime_build_id "$g")
	dir=$RUNTIME_CACHE/$id
	mkdir -p "$RUNTIME_CACHE"
	if [[ -f $dir/.built ]]; then
		log "runtime build $id cached ($dir)"
	else
		runtime_build "$g" "$dir.tmp"
		touch "$dir.tmp/.built"
		rm -rf "$dir"
		mv "$dir.tmp" "$dir"
	fi
	for d in "$RUNTIME_CACHE"/*; do
		if [[ -d $d && $d != "$dir" ]]; then rm -rf "$d"; fi
	done
	install -d -m 0755 "$RUNTIME_PREFIX"
	for b in "${RUNTIME_BINS[@]}"; do
		[[ -x $dir/$b ]] || die "the runtime build in $dir has no $b"
		if cmp -s "$dir/$b" "$RUNTIME_PREFIX/$b"; then
			continue
		fi
		# install writes a new file: a running containerd or shim keeps
		# the old one.
		install -m 0755 "$dir/$b" "$RUNTIME_PREFIX/$b"
		log "installed $RUNTIME_PREFIX/$b"
	done
	log "runtime: $(first_line "$RUNTIME_PREFIX/containerd" --version); $(first_line "$RUNTIME_PREFIX/runc" --version)"
}

# ---------------------------------------------------------------- probe
#
# `criu check` passing does not mean a dump works (CRIU 4.1.1 passes it on
# AMD EPYC VMs and then hangs in every dump), so dump and restore for real:
#   1. a throwaway process, with criu dump / criu restore;
#   2. a throwaway runc container (busybox, its own pid, net, mount, ipc and
#      uts namespaces, a TCP listener), with runc pause / checkpoint /
#      restore, as containerd's shim does for the daemon's sandboxes.
# Every step runs under a deadline. Everything made here lives under
# PROBE_DIR (runc gets a private --root there), and its cgroup path is
# unique; probe_cleanup removes it all, on success, failure or signal.

PROBE_DIR=""   # the probe's temp dir
PROBE_CRIU=""  # the criu binary probed
PROBE_PID=""   # host pid of the throwaway process (same before and after)
PROBE_TAG=""   # argv[0] of the throwaway process, to recognise it
PROBE_CG=""    # cgroup path of the throwaway container
PROBE_FAIL=""  # why the probe failed
PROBE_SHOW=()  # logs to show when it failed
PROBE_OUT=""   # stdout and stderr of the last step run
PROBE_RUNC=()  # runc with the probe's private root, log and criu
PROBE_MS=""    # what each step took, e.g. "dump 210 ms, restore 250 ms"
PROBE_STEP_PID="" # the running step's timeout process (its own process group)

# now_ms -> milliseconds since the epoch
now_ms() {
	local t=${EPOCHREALTIME/[.,]/}
	printf '%s\n' "${t:0:-3}"
}

# probe_step WHAT OUT CMD... : run CMD with no stdin and stdout+stderr to
# OUT, SIGTERM at the deadline and SIGKILL 5 s later. On failure, sets
# PROBE_FAIL and returns 1. CMD runs in the background and we `wait` for
# it, so that a signal to this script is handled at once (probe_cleanup
# then kills the step), not after the deadline.
probe_step() {
	local what=$1 out=$2 rc=0 t0=$SECONDS ms
	shift 2
	PROBE_OUT=$out
	ms=$(now_ms)
	timeout --kill-after=5 "$PROBE_TIMEOUT" "$@" </dev/null >"$out" 2>&1 &
	PROBE_STEP_PID=$!
	wait "$PROBE_STEP_PID" || rc=$?
	PROBE_STEP_PID=""
	PROBE_MS+="${PROBE_MS:+, }${what##* } $(($(now_ms) - ms)) ms"
	[[ $rc -ne 0 ]] || return 0
	if [[ $rc -eq 124 || ($rc -eq 137 && $((SECONDS - t0)) -ge $PROBE_TIMEOUT) ]]; then
		PROBE_FAIL="$what did not finish within its ${PROBE_TIMEOUT}s deadline (killed)"
	else
		PROBE_FAIL="$what failed (exit $rc)"
	fi
	return 1
}

# probe_pid_ours PID : true if PID is the throwaway process (not a zombie).
probe_pid_ours() {
	local st cmd
	st=$(awk '/^State:/ {print $2; exit}' "/proc/$1/status" 2>/dev/null) || return 1
	[[ -n $st && $st != Z && $st != X ]] || return 1
	cmd=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
	[[ $cmd == "$PROBE_TAG "* ]]
}

# probe_wait_gone PID : wait (bounded) until PID is gone, zombie included.
probe_wait_gone() {
	local i
	for ((i = 0; i < PROBE_TIMEOUT * 10; i++)); do
		[[ -e /proc/$1 ]] || return 0
		sleep 0.1
	done
	return 1
}

# probe_runc ARGS... : a quick runc query (state, ps), bounded too.
probe_runc() {
	timeout --kill-after=2 10 "${PROBE_RUNC[@]}" "$@" </dev/null
}

# probe_ns_pids ID -> the container's pids as its own pid namespace sees
# them, sorted, e.g. "1 2 3"
probe_ns_pids() {
	local p out=()
	for p in $(probe_runc ps --format json "$1" 2>/dev/null | tr -d '[]' | tr ',' ' '); do
		out+=("$(awk '/^NSpid:/ {print $NF; exit}' "/proc/$p/status" 2>/dev/null)")
	done
	printf '%s\n' "${out[@]}" | sort -n | tr '\n' ' ' | sed 's/ *$//'
}

# probe_init_pid ID -> the container's init pid on the host (runc state)
probe_init_pid() {
	probe_runc state "$1" 2>/dev/null | sed -n 's/^ *"pid": *\([0-9]*\).*/\1/p' | head -n1
}

probe_status() {
	probe_runc state "$1" 2>/dev/null | sed -n 's/^ *"status": *"\([a-z]*\)".*/\1/p' | head -n1
}

# probe_listening PID : true if PID's network namespace has a TCP listener
# on port 7000 (0x1B58).
probe_listening() {
	cat "/proc/$1/net/tcp" "/proc/$1/net/tcp6" 2>/dev/null | grep -q ':1B58 0\{8,32\}:0000 0A '
}

probe_process() {
	local d=$PROBE_DIR/process i
	PROBE_MS=""
	if ! mkdir -p "$d/img"; then
		PROBE_FAIL="cannot create $d/img"
		return 1
	fi
	# Its own session, no terminal, stdio on /dev/null, no other fds open:
	# what CRIU needs to dump a tree on its own.
	(
		cd /
		for i in /proc/"$BASHPID"/fd/*; do
			i=${i##*/}
			if [[ $i =~ ^[0-9]+$ && $i -gt 2 ]]; then eval "exec $i>&-"; fi
		done
		# shellcheck disable=SC2016 # $$ is the new shell's pid
		exec setsid bash -c 'echo $$ >"$1"; exec -a "$2" sleep "$3"' probe \
			"$d/pid" "$PROBE_TAG" $((PROBE_TIMEOUT * 10))
	) </dev/null >/dev/null 2>&1 &
	# Disowned: bash still reaps it, but does not report its death.
	disown "$!"
	for ((i = SECONDS + 10; SECONDS < i; )); do
		[[ -s $d/pid ]] && probe_pid_ours "$(<"$d/pid")" && break
		sleep 0.05
	done
	if [[ -s $d/pid ]]; then PROBE_PID=$(<"$d/pid"); fi
	if [[ -z $PROBE_PID ]] || ! probe_pid_ours "$PROBE_PID"; then
		PROBE_FAIL="the throwaway process did not start"
		return 1
	fi
	PROBE_SHOW=("$d/img/dump.log")
	probe_step "criu dump" "$d/dump.out" \
		"$PROBE_CRIU" dump -t "$PROBE_PID" -D "$d/img" -o dump.log -v4 || return 1
	# The dump killed it; its pid must be free (reaped) for the restore.
	if ! probe_wait_gone "$PROBE_PID"; then
		PROBE_FAIL="the dumped process $PROBE_PID did not go away"
		return 1
	fi
	PROBE_SHOW=("$d/img/restore.log")
	probe_step "criu restore" "$d/restore.out" \
		"$PROBE_CRIU" restore -d -D "$d/img" -o restore.log -v4 || return 1
	if ! probe_pid_ours "$PROBE_PID"; then
		PROBE_FAIL="criu restore exited 0 but the process is not running as pid $PROBE_PID"
		return 1
	fi
	kill -KILL "$PROBE_PID" 2>/dev/null || true
	log "probe: process: dumped and restored as pid $PROBE_PID ($PROBE_MS)"
}

probe_container() {
	local d=$PROBE_DIR/container id=runrecordd-probe sysctl="" pid0 pid1 ns0 ns1 st i
	PROBE_MS=""
	local b=$d/bundle
	# CRIU's restore needs a /tmp directory in a read-only root (it pivots
	# the old root onto it).
	if ! mkdir -p "$b/rootfs/bin" "$b/rootfs/proc" "$b/rootfs/dev" "$b/rootfs/sys" "$b/rootfs/tmp" \
		"$d/img" "$d/work" "$PROBE_DIR/runc" || ! cp /bin/busybox "$b/rootfs/bin/busybox"; then
		PROBE_FAIL="cannot build the container's root filesystem (is busybox-static installed?)"
		return 1
	fi
	for i in sh sleep nc; do ln -s busybox "$b/rootfs/bin/$i"; done
	# Set as runrecordd sets it in its sandboxes (only if the kernel has MPTCP).
	if [[ -e /proc/sys/net/mptcp/enabled ]]; then
		sysctl='"sysctl": {"net.mptcp.enabled": "0"},'
	fi
	cat >"$b/config.json" <<-JSON
		{
			"ociVersion": "1.0.2",
			"process": {
				"terminal": false,
				"user": {"uid": 0, "gid": 0},
				"args": ["/bin/sh", "-c", "nc -l -p 7000 & sleep $((PROBE_TIMEOUT * 10)) & wait"],
				"env": ["PATH=/bin"],
				"cwd": "/",
				"noNewPrivileges": true
			},
			"root": {"path": "rootfs", "readonly": true},
			"hostname": "$id",
			"mounts": [
				{"destination": "/proc", "type": "proc", "source": "proc"},
				{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=1024k"]},
				{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
			],
			"linux": {
				"cgroupsPath": "$PROBE_CG",
				$sysctl
				"resources": {"devices": [{"allow": false, "access": "rwm"}]},
				"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}],
				"maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
				"readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
			}
		}
	JSON
	# The container's stdio is runc's: /dev/null (runc logs to runc.log).
	PROBE_SHOW=("$PROBE_DIR/runc.log")
	probe_step "runc run" /dev/null "${PROBE_RUNC[@]}" run -d --bundle "$b" "$id" || return 1
	for ((i = SECONDS + 10; SECONDS < i; )); do
		pid0=$(probe_init_pid "$id")
		ns0=$(probe_ns_pids "$id")
		[[ -n $pid0 && $(wc -w <<<"$ns0") -eq 3 ]] && probe_listening "$pid0" && break
		sleep 0.05
	done
	if [[ -z $pid0 || $(wc -w <<<"$ns0") -ne 3 ]] || ! probe_listening "$pid0"; then
		PROBE_FAIL="the throwaway container did not come up (init pid ${pid0:-none}, pids in it: ${ns0:-none})"
		return 1
	fi
	probe_step "runc pause" "$d/pause.out" "${PROBE_RUNC[@]}" pause "$id" || return 1
	PROBE_SHOW=("$d/work/dump.log" "$PROBE_DIR/runc.log")
	probe_step "runc checkpoint" "$d/checkpoint.out" \
		"${PROBE_RUNC[@]}" checkpoint --image-path "$d/img" --work-path "$d/work" "$id" || return 1
	PROBE_SHOW=("$d/work/restore.log" "$PROBE_DIR/runc.log")
	probe_step "runc restore" /dev/null \
		"${PROBE_RUNC[@]}" restore -d --bundle "$b" --image-path "$d/img" --work-path "$d/work" "$id" || return 1
	st=$(probe_status "$id")
	pid1=$(probe_init_pid "$id")
	ns1=$(probe_ns_pids "$id")
	if [[ $st != running || -z $pid1 ]]; then
		PROBE_FAIL="runc restore exited 0 but the container is ${st:-gone}"
		return 1
	fi
	# A new pid namespace gets new host pids; inside it, the pids are kept.
	if [[ $ns1 != "$ns0" ]]; then
		PROBE_FAIL="the restored container has pids ($ns1) inside it, not ($ns0)"
		return 1
	fi
	if ! probe_listening "$pid1"; then
		PROBE_FAIL="the restored container lost its TCP listener"
		return 1
	fi
	PROBE_SHOW=("$PROBE_DIR/runc.log")
	probe_step "runc delete" "$d/delete.out" "${PROBE_RUNC[@]}" delete -f "$id" || return 1
	log "probe: runc container ($(first_line "$RUNTIME_PREFIX/runc" --version)): checkpointed and restored; pids inside it $ns1, init host pid $pid0 -> $pid1, TCP listener kept ($PROBE_MS)"
}

# probe_cgroup_cleanup : kill whatever is left in the container's cgroup and
# remove it, in every hierarchy.
probe_cgroup_cleanup() {
	[[ -n $PROBE_CG ]] || return 0
	local d dirs=() p i left
	for d in /sys/fs/cgroup/*"$PROBE_CG" /sys/fs/cgroup"$PROBE_CG"; do
		if [[ -d $d ]]; then dirs+=("$d"); fi
	done
	[[ ${#dirs[@]} -gt 0 ]] || return 0
	for d in "${dirs[@]}"; do
		if [[ -f $d/freezer.state ]]; then echo THAWED >"$d/freezer.state" 2>/dev/null || true; fi
		if [[ -f $d/cgroup.freeze ]]; then echo 0 >"$d/cgroup.freeze" 2>/dev/null || true; fi
		if [[ -f $d/cgroup.procs ]]; then
			while read -r p; do kill -KILL "$p" 2>/dev/null || true; done <"$d/cgroup.procs"
		fi
	done
	for ((i = 0; i < 50; i++)); do
		left=0
		for d in "${dirs[@]}"; do
			if [[ -d $d ]]; then
				find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
				if [[ -d $d ]]; then left=1; fi
			fi
		done
		[[ $left -eq 1 ]] || return 0
		sleep 0.1
	done
	warn "probe: could not remove the cgroup $PROBE_CG"
}

probe_cleanup() {
	[[ -n $PROBE_DIR ]] || return 0
	local id
	if [[ -n $PROBE_STEP_PID ]]; then
		# Interrupted in a step: kill timeout and what it runs (runc, criu).
		disown "$PROBE_STEP_PID" 2>/dev/null || true
		kill -KILL -- "-$PROBE_STEP_PID" 2>/dev/null || true
		kill -KILL "$PROBE_STEP_PID" 2>/dev/null || true
		PROBE_STEP_PID=""
	fi
	if [[ -n $PROBE_PID ]] && probe_pid_ours "$PROBE_PID"; then
		kill -KILL "$PROBE_PID" 2>/dev/null || true
	fi
	if [[ -d $PROBE_DIR/runc ]]; then
		for id in "$PROBE_DIR"/runc/*; do
			if [[ -d $id ]]; then
				timeout --kill-after=5 30 "${PROBE_RUNC[@]}" delete -f "${id##*/}" \
					</dev/null >/dev/null 2>&1 || true
			fi
		done
	fi
	probe_cgroup_cleanup
	rm -rf "$PROBE_DIR"
	PROBE_DIR=""
	PROBE_PID=""
}

# probe_image_parks : true if image parks work with PROBE_CRIU on this host.
probe_image_parks() {
	mkdir -p "$CACHE_ROOT"
	PROBE_DIR=$(mktemp -d "$CACHE_ROOT/probe.XXXXXX") || return 1
	PROBE_TAG=runrecordd-probe-$$
	PROBE_CG=/runrecordd-probe-$$-${PROBE_DIR##*.}
	PROBE_FAIL=""
	PROBE_SHOW=()
	PROBE_OUT=""
	PROBE_MS=""
	# runc runs the criu first on its PATH (it has had no --criu flag since 1.4).
	PROBE_RUNC=(env "PATH=${PROBE_CRIU%/*}:$PATH" "$RUNTIME_PREFIX/runc"
		--root "$PROBE_DIR/runc" --log "$PROBE_DIR/runc.log")
	if [[ -n ${RUNRECORDD_CRIU:-} ]]; then
		# Not the installed binary: check it first (under the deadline too).
		PROBE_SHOW=("$PROBE_DIR/check.out")
		probe_step "criu check" "$PROBE_DIR/check.out" "$PROBE_CRIU" check || return 1
		PROBE_OUT=""
		if ! grep -q 'Looks good' "$PROBE_DIR/check.out"; then
			PROBE_FAIL="criu check did not say 'Looks good.'"
			return 1
		fi
	fi
	if ! probe_process; then
		PROBE_FAIL="throwaway process: $PROBE_FAIL"
		return 1
	fi
	if ! probe_container; then
		PROBE_FAIL="throwaway runc container: $PROBE_FAIL"
		return 1
	fi
}

# probe_report_failure : print why, the tails of the logs, and keep them.
probe_report_failure() {
	local f seen=" " kept=""
	warn "probe: $PROBE_FAIL"
	rm -rf "$PROBE_LOGS"
	for f in ${PROBE_OUT:+"$PROBE_OUT"} "${PROBE_SHOW[@]}"; do
		if [[ -s $f && $seen != *" $f "* ]]; then
			seen+="$f "
			printf 'setup: --- last 15 lines of %s ---\n' "${f#"$PROBE_DIR"/}" >&2
			tail -n 15 "$f" | sed 's/^/  /' >&2
			mkdir -p "$PROBE_LOGS"
			cp -f "$f" "$PROBE_LOGS/"
			kept="; logs kept in $PROBE_LOGS"
		fi
	done
	[[ -n $kept ]] || warn "probe: no log was written"
	warn "image parks are unavailable on this host: $PROBE_CRIU cannot dump and restore here (transcript runs still work)$kept"
}

# run_probe : probe, clean up, report; exits 1 on failure only when
# RUNRECORDD_REQUIRE_IMAGE_PARKS=1.
run_probe() {
	local t0 ok=0 quirks=""
	t0=$(now_ms)
	log "probe: dumping and restoring with $PROBE_CRIU (${PROBE_TIMEOUT}s deadline per step) ..."
	trap probe_cleanup EXIT
	trap 'warn "probe: interrupted (SIGHUP); cleaning up"; exit 129' HUP
	trap 'warn "probe: interrupted (SIGINT); cleaning up"; exit 130' INT
	trap 'warn "probe: interrupted (SIGTERM); cleaning up"; exit 143' TERM
	if probe_image_parks; then
		ok=1
		if grep -qs "Hardware breakpoints don't seem to work" \
			"$PROBE_DIR/process/img/dump.log" "$PROBE_DIR/container/work/dump.log"; then
			quirks=" (hardware breakpoints off in this VM)"
		fi
	else
		probe_report_failure
	fi
	probe_cleanup
	trap - EXIT HUP INT TERM
	if [[ $ok -eq 1 ]]; then
		rm -rf "$PROBE_LOGS"
		log "probe: image parks work$quirks; probe took $(($(now_ms) - t0)) ms"
	elif [[ ${RUNRECORDD_REQUIRE_IMAGE_PARKS:-0} == 1 ]]; then
		die "RUNRECORDD_REQUIRE_IMAGE_PARKS=1 and image parks do not work on this host"
	else
		warn "continuing without image parks (set RUNRECORDD_REQUIRE_IMAGE_PARKS=1 to make this fatal)"
	fi
}

# ---------------------------------------------------------------- main

[[ $PROBE_TIMEOUT =~ ^[1-9][0-9]*$ ]] ||
	die "RUNRECORDD_PROBE_TIMEOUT must be a whole number of seconds > 0 (got '$PROBE_TIMEOUT')"

os_name=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || true)
log "host: ${os_name:-unknown OS}, kernel $(uname -r)"
if [[ -d /run/systemd/system ]]; then
	log "systemd is running (a system containerd service may be started by the package; runrecordd runs its own)"
else
	log "systemd is not running (no services will be started)"
fi

# 1. the runtime, and the packages beside it
ensure_pkgs "${RUNTIME_PKGS[@]}"
ensure_runtime

# 2. CRIU
drop_old_trixie_src
ensure_criu_rundir
ensure_criu
installed_criu=$(PATH=$SYS_PATH command -v criu || true)
if [[ -n $installed_criu && $installed_criu == "$CRIU_CHECKED" ]]; then
	check_out=$CRIU_CHECK_OUT # ensure_criu has just checked this one
elif ! check_out=$(criu_check "$installed_criu"); then
	printf '%s\n' "$check_out" >&2
	die "criu check failed with ${installed_criu:-criu (not found)}"
fi
log "criu check: $(grep -m1 'Looks good' <<<"$check_out")"
caller_criu=$(command -v criu || true)
if [[ -n $caller_criu && $caller_criu != "$(PATH=$SYS_PATH command -v criu)" ]]; then
	warn "criu on your PATH is $caller_criu, not $(PATH=$SYS_PATH command -v criu); put $CRIU_PREFIX first"
elif [[ -z $caller_criu ]]; then
	warn "criu is not on your PATH (installed at $CRIU_BIN); add $CRIU_PREFIX to PATH"
fi

# 3. iptables-restore (CRIU's network lock uses it)
export PATH=$SYS_PATH
ipr=$(command -v iptables-restore || true)
[[ -n $ipr ]] || die "iptables-restore not found (package iptables); CRIU network locking needs it"
log "iptables-restore: $ipr ($(iptables-restore --version 2>&1 | head -n1))"
nft=$(command -v nft || true)
[[ -n $nft ]] || die "nft not found (package nftables); the executor clears a killed dump's network lock with it"
log "nft: $nft ($(nft --version 2>&1 | head -n1))"

# 4. probe: a real dump and restore, of a process and of a runc container
if [[ -n ${RUNRECORDD_CRIU:-} ]]; then
	PROBE_CRIU=$(command -v "$RUNRECORDD_CRIU" || true)
	[[ -n $PROBE_CRIU && -f $PROBE_CRIU && -x $PROBE_CRIU ]] || die "RUNRECORDD_CRIU=$RUNRECORDD_CRIU is not an executable"
	[[ $PROBE_CRIU == /* ]] || PROBE_CRIU=$(realpath "$PROBE_CRIU")
else
	PROBE_CRIU=$(command -v criu)
fi
run_probe

# 5. summary
for b in containerd ctr runc; do
	log "$b: $RUNTIME_PREFIX/$b ($(first_line "$RUNTIME_PREFIX/$b" --version))"
	found=$(PATH=$CALLER_PATH command -v "$b" || true)
	if [[ $found != "$RUNTIME_PREFIX/$b" ]]; then
		warn "$b on your PATH is ${found:-none}, not $RUNTIME_PREFIX/$b; put $RUNTIME_PREFIX first"
	fi
done
log "criu: $(command -v criu) $(criu --version 2>&1 | head -n1)"
log "done in $(($(date +%s) - START_TS))s"
