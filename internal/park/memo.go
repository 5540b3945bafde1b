package park

import (
	"sync"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// checked hands a memory image's listing, as [OfferedServed] found it
// intact, on to the [LayoutServed] of the same resume, which would
// otherwise read and decode it again (32,768 entries for a 512 MiB image;
// its cost, most of it the first touch of the memory it fills, is in
// docs/benchmarks.md). A listing is named by its
// address, so the one kept is the one the store holds under it: nothing
// is trusted that a second read would have checked. Each is taken once,
// by the same store, and at most checkedMax are kept (the newest), each
// of a listing of at most checkedMaxBytes (its decoded names keep the
// whole listing's bytes): a resume refused after its check leaves one
// behind until later ones push it out.
var checked = checkedListings{byKey: map[checkedKey]checkedListing{}}

const (
	checkedMax = 2
	// checkedMaxBytes is about the listing of a 3 GiB image in 16 KiB
	// chunks; a larger one is read again by its layout.
	checkedMaxBytes = 16 << 20
)

type checkedKey struct {
	st  *store.Store
	mem record.Address
}

type checkedListing struct {
	es  []store.Entry
	cfs []store.ChunkedFile
}

type checkedListings struct {
	mu    sync.Mutex
	byKey map[checkedKey]checkedListing
	order []checkedKey // oldest first
}

// put keeps the entries and chunked files of st's memory image mem,
// found intact, unless its listing is over checkedMaxBytes.
func (c *checkedListings) put(st *store.Store, mem record.Address, l checkedListing) {
	n := 0
	for _, e := range l.es {
		if n += len(e.Name) + 48; n > checkedMaxBytes {
			return
		}
	}
	k := checkedKey{st, mem}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[k]; !ok {
		c.order = append(c.order, k)
	}
	c.byKey[k] = l
	for len(c.order) > checkedMax {
		delete(c.byKey, c.order[0])
		c.order = c.order[1:]
	}
}

// take returns and forgets what put kept for st's mem.
func (c *checkedListings) take(st *store.Store, mem record.Address) (checkedListing, bool) {
	k := checkedKey{st, mem}
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byKey[k]
	if ok {
		delete(c.byKey, k)
		for i, o := range c.order {
			if o == k {
				c.order = append(c.order[:i], c.order[i+1:]...)
				break
			}
		}
	}
	return l, ok
}

// made holds the memory listings this process's parks wrote in the slab
// form (docs/store.md, "Slabs"): the chunks' addresses of their indexes
// were hashed here from the bytes of the slabs they list, so a later park
// lists a chunk of one in its slab on its address alone. The listing, not
// the index, is what is trusted: an index names its slabs by number, and
// another listing may pair the same index with other slabs. Any other
// listing (an imported one, or one made before the daemon started) is
// hostile or unknown: a chunk of it is listed only once its bytes there
// are compared with the park's. At most madeMax are kept; then the set
// starts again.
var made = madeListings{set: map[checkedKey]bool{}}

const madeMax = 1 << 14

type madeListings struct {
	mu  sync.Mutex
	set map[checkedKey]bool
}

func (m *madeListings) put(st *store.Store, mem record.Address) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.set) >= madeMax {
		clear(m.set)
	}
	m.set[checkedKey{st, mem}] = true
}

func (m *madeListings) has(st *store.Store, mem record.Address) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set[checkedKey{st, mem}]
}

// kin holds, by store and kin ([ImageOptions.Kin]), the memory listing of
// the newest park in the slab form that this process made of a run of
// that kin. A run's first park lists, on their addresses alone, the
// chunks it shares with that listing in its slabs (docs/chunked-images.md,
// "Kin"): runs of one program hold many pages alike, and a first park
// has no base of its own. A closed run's park is not taken (its
// snapshots' retention is its own). At most kinMax kins are kept; then
// the set starts again.
var kin = kinParks{last: map[kinKey]kinPark{}}

const kinMax = 1 << 12

type kinKey struct {
	st  *store.Store
	kin string
}

// kinPark is a kin's newest park: its memory listing and its run.
type kinPark struct {
	mem record.Address
	run string
}

type kinParks struct {
	mu   sync.Mutex
	last map[kinKey]kinPark
}

func (k *kinParks) put(st *store.Store, of string, p kinPark) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.last) >= kinMax {
		clear(k.last)
	}
	k.last[kinKey{st, of}] = p
}

// get is the kin's newest listing, if this process still knows it as
// one it made ([made]) and its run is not closed.
func (k *kinParks) get(st *store.Store, of string) (record.Address, bool) {
	k.mu.Lock()
	p, ok := k.last[kinKey{st, of}]
	k.mu.Unlock()
	if !ok || !made.has(st, p.mem) {
		return record.Address{}, false
	}
	ret, err := st.RetentionOf(p.run)
	if err != nil || !ret.Closed.IsZero() || !ret.Released.IsZero() {
		return record.Address{}, false
	}
	return p.mem, true
}
