// Package runrecordd holds what the binary carries from the repository
// itself: the conformance pack, so `runrecordd conformance` runs anywhere.
package runrecordd

import "embed"

// Conformance is testdata/conformance, embedded.
//
//go:embed testdata/conformance/*.json
var Conformance embed.FS
