#!/usr/bin/env bash
# deploy/setup.sh - prepare a Debian 12 host to run runrecordd.
#
# Installs containerd, runc and iptables from Debian, and makes sure a CRIU
# >= 4 that passes `criu check` is on PATH (building CRIU 4.1.1 from the
# Debian trixie source tarball when needed). Idempotent: a rerun on a host
# that is already set up installs nothing, downloads nothing and builds
# nothing. See docs/setup.md.
#
# Run as root, non-interactively (works with no stdin, as in CI).
# Environment knobs:
#   RUNRECORDD_CACHE_DIR   cache root (default /var/cache/runrecordd)
#   RUNRECORDD_CRIU_FORCE_BUILD=1   rebuild CRIU even if a good one exists
set -Eeuo pipefail

readonly CRIU_VERSION=4.1.1
readonly CRIU_ORIG=criu_${CRIU_VERSION}.orig.tar.xz
readonly CRIU_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
readonly CRIU_PREFIX=/usr/local/sbin
readonly CRIU_BIN=${CRIU_PREFIX}/criu
readonly CACHE_ROOT=${RUNRECORDD_CACHE_DIR:-/var/cache/runrecordd}
readonly CRIU_CACHE=${CACHE_ROOT}/criu-${CRIU_VERSION}
readonly DEBIAN_SOURCES=/etc/apt/sources.list.d/debian.sources
readonly TRIXIE_SRC_LIST=/etc/apt/sources.list.d/runrecordd-trixie-src.sources
readonly ARCHIVE_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

# Runtime packages (Debian bookworm). containerd pulls runc in as a
# dependency; list it anyway so it is explicit.
readonly RUNTIME_PKGS=(containerd runc iptables xz-utils ca-certificates)
# Build dependencies for `make criu` (bookworm versions are fine).
readonly CRIU_BUILD_PKGS=(
	gcc make pkg-config
	libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-protobuf
	libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev
	libnftables-dev uuid-dev
)

export DEBIAN_FRONTEND=noninteractive
# A sane PATH for the tools we run ourselves (the caller's PATH may put
# pyenv, cargo, ... first). /usr/local/sbin precedes /usr/sbin on purpose.
readonly SYS_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

START_TS=$(date +%s)

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

# criu_version BIN -> prints e.g. 4.1.1 (empty if unknown)
criu_version() {
	"$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1
}

# criu_good BIN : true if BIN exists, is >= 4 and `criu check` says Looks good.
criu_good() {
	local bin=$1 ver out
	[[ -x $bin ]] || return 1
	ver=$(criu_version "$bin")
	[[ -n $ver && ${ver%%.*} -ge 4 ]] || return 1
	out=$("$bin" check 2>&1) || return 1
	grep -q 'Looks good' <<<"$out"
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

ensure_trixie_src() {
	local uri want
	uri=$(debian_mirror_uri)
	want=$(printf 'Types: deb-src\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
		"$uri" "$ARCHIVE_KEYRING")
	if [[ -f $TRIXIE_SRC_LIST && $(<"$TRIXIE_SRC_LIST") == "$want" ]]; then
		log "trixie deb-src entry already present ($TRIXIE_SRC_LIST)"
		apt_update
	else
		log "adding trixie deb-src entry ($TRIXIE_SRC_LIST, mirror from $DEBIAN_SOURCES)"
		printf '%s\n' "$want" >"$TRIXIE_SRC_LIST"
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
	ensure_trixie_src
	rm -rf "$dl"
	mkdir -p "$dl"
	# Let apt's unprivileged _apt user write here (avoids the sandbox warning).
	if id _apt >/dev/null 2>&1; then chown _apt "$dl"; fi
	log "downloading criu/trixie source (apt-get source --download-only) ..."
	local rc=0
	(cd "$dl" && apt-get source -qq --download-only "criu/trixie" </dev/null >"$CRIU_CACHE/download.log" 2>&1) || rc=$?
	if [[ ! -f $dl/$CRIU_ORIG ]]; then
		tail -n 20 "$CRIU_CACHE/download.log" >&2 || true
		die "apt-get source criu/trixie (exit $rc) did not fetch $CRIU_ORIG; log: $CRIU_CACHE/download.log"
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

build_criu() {
	local src=$CRIU_CACHE/src/criu-$CRIU_VERSION log_file=$CRIU_CACHE/build.log
	log "building CRIU $CRIU_VERSION from source (log: $log_file) ..."
	ensure_pkgs --quiet "${CRIU_BUILD_PKGS[@]}"
	fetch_criu_orig
	if [[ ! -f $src/.extracted ]]; then
		rm -rf "$CRIU_CACHE/src"
		mkdir -p "$CRIU_CACHE/src.tmp"
		tar -C "$CRIU_CACHE/src.tmp" -xJf "$CRIU_CACHE/$CRIU_ORIG"
		[[ -d $CRIU_CACHE/src.tmp/criu-$CRIU_VERSION ]] ||
			die "unexpected layout in $CRIU_ORIG (no criu-$CRIU_VERSION/ directory)"
		touch "$CRIU_CACHE/src.tmp/criu-$CRIU_VERSION/.extracted"
		mv "$CRIU_CACHE/src.tmp" "$CRIU_CACHE/src"
	fi
	local t0=$SECONDS
	if ! (cd "$src" && PATH=$SYS_PATH make -j2 criu </dev/null >"$log_file" 2>&1); then
		tail -n 30 "$log_file" >&2 || true
		die "make criu failed; full log: $log_file"
	fi
	[[ -x $src/criu/criu ]] || die "make criu succeeded but $src/criu/criu is missing"
	install -m 0755 "$src/criu/criu" "$CRIU_CACHE/criu"
	log "built CRIU $CRIU_VERSION in $((SECONDS - t0))s"
}

install_cached_criu() {
	install -d -m 0755 "$CRIU_PREFIX"
	install -m 0755 "$CRIU_CACHE/criu" "$CRIU_BIN"
	log "installed $CRIU_BIN ($(criu_version "$CRIU_BIN"))"
}

ensure_criu() {
	local cur ver
	cur=$(PATH=$SYS_PATH command -v criu || true)
	if [[ ${RUNRECORDD_CRIU_FORCE_BUILD:-0} != 1 && -n $cur ]] && criu_good "$cur"; then
		log "criu $(criu_version "$cur") at $cur already passes criu check"
		return 0
	fi
	if [[ -z $cur ]]; then
		log "criu not found"
	else
		ver=$(criu_version "$cur")
		if [[ -z $ver || ${ver%%.*} -lt 4 ]]; then
			log "criu at $cur is version ${ver:-unknown} (< 4)"
		else
			log "criu $ver at $cur fails criu check"
		fi
	fi
	mkdir -p "$CRIU_CACHE"
	if [[ ${RUNRECORDD_CRIU_FORCE_BUILD:-0} != 1 && -x $CRIU_CACHE/criu ]] && criu_good "$CRIU_CACHE/criu"; then
		log "using cached CRIU $CRIU_VERSION build ($CRIU_CACHE/criu)"
	else
		build_criu
	fi
	install_cached_criu
}

# ---------------------------------------------------------------- main

os_name=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || true)
log "host: ${os_name:-unknown OS}, kernel $(uname -r)"
if [[ -d /run/systemd/system ]]; then
	log "systemd is running (a system containerd service may be started by the package; runrecordd runs its own)"
else
	log "systemd is not running (no services will be started)"
fi

# 1. runtime packages
ensure_pkgs "${RUNTIME_PKGS[@]}"

# 2. CRIU
ensure_criu
check_out=$(PATH=$SYS_PATH criu check 2>&1) || {
	printf '%s\n' "$check_out" >&2
	die "criu check failed with $(PATH=$SYS_PATH command -v criu)"
}
grep -q 'Looks good' <<<"$check_out" || {
	printf '%s\n' "$check_out" >&2
	die "criu check did not say 'Looks good.'"
}
log "criu check: $(grep -m1 'Looks good' <<<"$check_out")"
caller_criu=$(command -v criu || true)
if [[ -n $caller_criu && $caller_criu != "$(PATH=$SYS_PATH command -v criu)" ]]; then
	warn "criu on your PATH is $caller_criu, not $(PATH=$SYS_PATH command -v criu); put $CRIU_PREFIX first"
elif [[ -z $caller_criu ]]; then
	warn "criu is not on your PATH (installed at $CRIU_BIN); add $CRIU_PREFIX to PATH"
fi

# 3. iptables-restore (CRIU's network lock uses it)
ipr=$(PATH=$SYS_PATH command -v iptables-restore || true)
[[ -n $ipr ]] || die "iptables-restore not found (package iptables); CRIU network locking needs it"
log "iptables-restore: $ipr ($(PATH=$SYS_PATH iptables-restore --version 2>&1 | head -n1))"

# 4. summary
export PATH=$SYS_PATH
log "containerd: $(containerd --version 2>&1 | head -n1)"
log "ctr: $(ctr --version 2>&1 | head -n1)"
log "runc: $(runc --version 2>&1 | head -n1)"
log "criu: $(command -v criu) $(criu --version 2>&1 | head -n1)"
log "done in $(($(date +%s) - START_TS))s"
