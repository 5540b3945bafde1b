package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The admission gate's defaults (docs/fleet.md, "Peer listener and keys").
const (
	// DefaultReads is how many admission reads may be under way at once:
	// a flood of unknown keys waits for these, and leaves etcd to the
	// hosts' lease renewals and fences.
	DefaultReads = 16
	// DefaultRefusalTTL is how long a key the fleet does not admit is
	// refused without a read: a key admitted meanwhile gets through once
	// it has passed.
	DefaultRefusalTTL = 30 * time.Second
	// DefaultRefusals is how many refused keys are remembered; past it the
	// oldest are forgotten.
	DefaultRefusals = 4096
)

// GateLimits bound a [Gate]; zero fields take the defaults.
type GateLimits struct {
	Reads      int
	RefusalTTL time.Duration
	Refusals   int
}

// Gate is admitted with its reads bounded: one read per key at a time
// (handshakes of a key whose read is under way wait for its answer), at
// most lim.Reads at once (a handshake waits for a slot until its context
// ends: it is then refused as unconfirmed), and a key refused as not
// admitted refused again without a read for lim.RefusalTTL. Admissions
// are never remembered: every handshake of an admitted key reads afresh.
func Gate(admitted Admitted, lim GateLimits) Admitted {
	if lim.Reads <= 0 {
		lim.Reads = DefaultReads
	}
	if lim.RefusalTTL <= 0 {
		lim.RefusalTTL = DefaultRefusalTTL
	}
	if lim.Refusals <= 0 {
		lim.Refusals = DefaultRefusals
	}
	g := &gate{admitted: admitted, lim: lim, slots: make(chan struct{}, lim.Reads),
		reading: map[record.Address]*read{}, refused: map[record.Address]refusal{}}
	return g.admit
}

type gate struct {
	admitted Admitted
	lim      GateLimits
	slots    chan struct{}

	mu      sync.Mutex
	reading map[record.Address]*read
	refused map[record.Address]refusal
	order   []record.Address // refused keys, oldest first
}

// read is one admission read under way; done is closed once role and err
// are set.
type read struct {
	done chan struct{}
	role fleet.Role
	err  error
}

type refusal struct {
	until time.Time
	err   error
}

func (g *gate) admit(ctx context.Context, key record.Address) (fleet.Role, error) {
	g.mu.Lock()
	if r, ok := g.refused[key]; ok {
		if time.Now().Before(r.until) {
			g.mu.Unlock()
			return "", r.err
		}
		delete(g.refused, key)
	}
	if r, ok := g.reading[key]; ok {
		g.mu.Unlock()
		select {
		case <-r.done:
			return r.role, r.err
		case <-ctx.Done():
			return "", fmt.Errorf("%w: waiting for the admission read of key %s: %w", ErrUnconfirmed, key, ctx.Err())
		}
	}
	r := &read{done: make(chan struct{})}
	g.reading[key] = r
	g.mu.Unlock()

	r.role, r.err = g.readSlot(ctx, key)
	g.mu.Lock()
	delete(g.reading, key)
	if errors.Is(r.err, fleet.ErrNotAdmitted) {
		g.remember(key, r.err)
	}
	g.mu.Unlock()
	close(r.done)
	return r.role, r.err
}

// readSlot reads key's admission once a slot is free, or fails when ctx
// ends first.
func (g *gate) readSlot(ctx context.Context, key record.Address) (fleet.Role, error) {
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("%w: no admission read free for key %s: %w", ErrUnconfirmed, key, ctx.Err())
	}
	defer func() { <-g.slots }()
	return g.admitted(ctx, key)
}

// remember refuses key without a read until the TTL passes; g.mu is held.
func (g *gate) remember(key record.Address, err error) {
	if _, ok := g.refused[key]; !ok {
		g.order = append(g.order, key)
	}
	g.refused[key] = refusal{until: time.Now().Add(g.lim.RefusalTTL), err: err}
	for len(g.refused) > g.lim.Refusals && len(g.order) > 0 {
		delete(g.refused, g.order[0])
		g.order = g.order[1:]
	}
	if len(g.order) > 2*g.lim.Refusals {
		// Keys read again after their TTL are in order twice: keep the
		// ones still remembered.
		kept := g.order[:0]
		seen := map[record.Address]bool{}
		for _, k := range g.order {
			if _, ok := g.refused[k]; ok && !seen[k] {
				kept = append(kept, k)
				seen[k] = true
			}
		}
		g.order = kept
	}
}
