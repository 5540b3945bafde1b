package daemon

import "github.com/runrecordd/runrecordd/pkg/park"

// ErrNoSpace refuses an image park before it writes anything (park.Room).
var ErrNoSpace = park.ErrNoSpace

// DefaultMinFree is the free space an image park leaves on the store's
// filesystem, beyond what it expects to write.
const DefaultMinFree = park.DefaultMinFree
