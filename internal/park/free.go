package park

import "github.com/runrecordd/runrecordd/internal/store"

// Free is what the store's filesystem can still take beyond the minFree
// bytes (DefaultMinFree when 0) every park leaves there: the room a host
// offers runs moved to it.
func Free(st *store.Store, minFree uint64) (uint64, error) {
	avail, err := statfsFree(st.Dir())
	if err != nil {
		return 0, err
	}
	if minFree == 0 {
		minFree = DefaultMinFree
	}
	if avail < minFree {
		return 0, nil
	}
	return avail - minFree, nil
}
