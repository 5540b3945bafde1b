package park

import (
	"sync"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// checked hands a memory image's listing, as [OfferedServed] found it
// intact, on to the [LayoutServed] of the same resume, which would
// otherwise read and decode it again (2.4 MB and 32,768 entries for a
// 512 MiB image: 5–30 ms of a resume on the AMD machine, most of it the
// first touch of the memory it fills). A listing is named by its
// address, so the one kept is the one the store holds under it: nothing
// is trusted that a second read would have checked. Each is taken once,
// and at most checkedMax are kept (the newest): a resume refused after
// its check leaves one behind until later ones push it out.
var checked = checkedListings{byAddr: map[record.Address]checkedListing{}}

const checkedMax = 2

type checkedListing struct {
	es  []store.Entry
	cfs []store.ChunkedFile
}

type checkedListings struct {
	mu     sync.Mutex
	byAddr map[record.Address]checkedListing
	order  []record.Address // oldest first
}

// put keeps mem's entries and chunked files, found intact.
func (c *checkedListings) put(mem record.Address, l checkedListing) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byAddr[mem]; !ok {
		c.order = append(c.order, mem)
	}
	c.byAddr[mem] = l
	for len(c.order) > checkedMax {
		delete(c.byAddr, c.order[0])
		c.order = c.order[1:]
	}
}

// take returns and forgets what put kept for mem.
func (c *checkedListings) take(mem record.Address) (checkedListing, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byAddr[mem]
	if ok {
		delete(c.byAddr, mem)
		for i, a := range c.order {
			if a == mem {
				c.order = append(c.order[:i], c.order[i+1:]...)
				break
			}
		}
	}
	return l, ok
}
