//go:build linux

package e2e

// The attack suite: a hostile unit (units/hostile) and hostile bundles, one
// test per finding of docs/trust.md. Every test checks that the host is
// untouched, the record unchanged, and the daemon still serving.

// hostileImage is the name the hostile unit's image is imported under.
const hostileImage = "runrecordd.test/hostile:1"

// hostileArchive and hostileDigest: the hostile unit's OCI archive and its
// manifest digest, built by trBuildUnits.
var hostileArchive, hostileDigest string
