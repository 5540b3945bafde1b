package drain

import (
	"errors"
	"fmt"
	"sync"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// ErrNoHost is a run no host can take: none answered, none matches its
// manifest, or none has room for it.
var ErrNoHost = errors.New("no host can take the run")

// placement is the hosts' room as a drain spends it.
type placement struct {
	mu     sync.Mutex
	hosts  []Target
	placed []uint64 // bytes this drain sent (or is sending) to each host
	count  []int    // runs this drain sent (or is sending) to each host
}

func newPlacement(hosts []Target) *placement {
	return &placement{hosts: hosts, placed: make([]uint64, len(hosts)), count: make([]int, len(hosts))}
}

// left is the room host h has once what this drain placed there is
// counted.
func (p *placement) left(h int) uint64 {
	if p.placed[h] >= p.hosts[h].Free {
		return 0
	}
	return p.hosts[h].Free - p.placed[h]
}

// reserve picks, among the hosts not tried that can take run, the one with
// the most room left — on a tie the one sent fewest runs, then the first
// given — and counts run's bytes against it. With none it returns -1 and why each host cannot.
func (p *placement) reserve(run Run, tried map[record.Address]bool) (int, []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	best := -1
	var why []error
	for h, host := range p.hosts {
		switch {
		case tried[host.Key]:
			continue
		case host.Err != nil:
			why = append(why, host.Err) // it names the host
		case host.Refuses[run.ID] != nil:
			why = append(why, fmt.Errorf("host %s: %w", host.Key, host.Refuses[run.ID]))
		case p.left(h) < run.Bytes:
			why = append(why, fmt.Errorf("host %s: %w: the run needs %d bytes, the host has %d left", host.Key, ErrNoHost, run.Bytes, p.left(h)))
		case best < 0 || p.left(h) > p.left(best) || p.left(h) == p.left(best) && p.count[h] < p.count[best]:
			best = h
		}
	}
	if best < 0 {
		if len(why) == 0 {
			why = append(why, fmt.Errorf("%w: no host to move it to", ErrNoHost))
		}
		return -1, why
	}
	p.placed[best] += run.Bytes
	p.count[best]++
	return best, nil
}

// release takes back bytes reserved on host h for a run it refused.
func (p *placement) release(h int, bytes uint64) {
	p.mu.Lock()
	p.placed[h] -= bytes
	p.count[h]--
	p.mu.Unlock()
}
