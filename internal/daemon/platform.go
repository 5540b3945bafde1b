package daemon

import (
	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// StoredBytes is how many bytes of the store runs reach together: every
// object their records reach (image snapshots unless released), each
// object counted once however many of them reach it (a platform key's
// store quota, internal/platform). Reading it takes no run's lock.
func (d *Daemon) StoredBytes(runs []answers.Summary) (int64, error) {
	seen := map[record.Address]bool{}
	var total int64
	for _, s := range runs {
		rec, err := d.st.Record(s.ID)
		if err != nil {
			return 0, err
		}
		addrs, err := bundle.Reached(d.st, rec, !s.Released)
		if err != nil {
			return 0, err
		}
		for _, a := range addrs {
			if seen[a] {
				continue
			}
			seen[a] = true
			n, err := d.st.Size(a)
			if err != nil {
				return 0, err
			}
			total += n
		}
	}
	return total, nil
}
