package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// MaxNameAddrs bounds the addresses a destination by name holds at once
// in its set: an answer that would overflow it is not allowed (the unit
// gets SERVFAIL).
const MaxNameAddrs = 1024

// nameSetPrefix begins the name of every run's set of a destination by
// name: n-N-I is run N's set for its allow-list's Ith destination.
const nameSetPrefix = "n-"

func nameSet(slot, i int) string { return nameSetPrefix + strconv.Itoa(slot) + "-" + strconv.Itoa(i) }

// slotOfSet is the slot of a run's set name, if it is one.
func slotOfSet(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, nameSetPrefix)
	if !ok {
		return 0, false
	}
	n, _, ok := strings.Cut(rest, "-")
	slot, err := strconv.Atoi(n)
	return slot, ok && err == nil && strconv.Itoa(slot) == n
}

// addNameSets adds, emptied, the sets of run slot's destinations by name;
// the result holds allow[i]'s set at i (nil for a prefix).
func addNameSets(c *nftables.Conn, ip *nftables.Table, slot int, allow []allowRule) []*nftables.Set {
	sets := make([]*nftables.Set, len(allow))
	for i, a := range allow {
		if a.name == "" {
			continue
		}
		s := &nftables.Set{Table: ip, Name: nameSet(slot, i), KeyType: nftables.TypeIPAddr, HasTimeout: true, Size: MaxNameAddrs}
		// The library refuses only an anonymous set here; the kernel's
		// refusal comes with the transaction's.
		_ = c.AddSet(s, nil)
		c.FlushSet(s)
		sets[i] = s
	}
	return sets
}

// delNameSets deletes run slot's sets, after its forward chain (whose
// rules refer to them) in the same transaction.
func (h *Gateway) delNameSets(c *nftables.Conn, slot int) error {
	sets, err := c.GetSets(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: h.table})
	if errors.Is(err, unix.ENOENT) { // no table: no set
		return nil
	}
	if err != nil {
		return fmt.Errorf("list nftables sets: %w", err)
	}
	for _, s := range sets {
		if n, ok := slotOfSet(s.Name); ok && n == slot {
			c.DelSet(s)
		}
	}
	return nil
}

// setSlots is the slots that have sets in the host's table.
func (h *Gateway) setSlots(c *nftables.Conn) ([]int, error) {
	sets, err := c.GetSets(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: h.table})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list nftables sets: %w", err)
	}
	var out []int
	for _, s := range sets {
		if n, ok := slotOfSet(s.Name); ok && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Names is the names the run's allow-list gives, each once.
func (r *Run) Names() []string {
	var out []string
	for _, a := range r.rules {
		if a.name != "" && !slices.Contains(out, a.name) {
			out = append(out, a.name)
		}
	}
	return out
}

// Allowed lets the run reach addrs, the resolver's answer for name, for
// ttl: each is added (or its time renewed) to the set of every
// destination of the run naming name, so the ports and protocol are
// that destination's. A name the run's allow-list does not give is an
// error (ErrInvalid); so is a closed run (ErrClosed).
func (r *Run) Allowed(name string, addrs []netip.Addr, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: a time to live of %s", ErrInvalid, ttl)
	}
	elems := make([]nftables.SetElement, 0, len(addrs))
	for _, a := range addrs {
		if !a.Is4() {
			return fmt.Errorf("%w: address %s: not IPv4", ErrInvalid, a)
		}
		k := a.As4()
		elems = append(elems, nftables.SetElement{Key: k[:], Timeout: ttl})
	}
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.closed {
		return fmt.Errorf("slot %d: %w", r.slot, ErrClosed)
	}
	ip := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: h.table}
	found := false
	err := h.nft(func(c *nftables.Conn) error {
		for i, a := range r.rules {
			if a.name != name {
				continue
			}
			found = true
			if len(elems) == 0 {
				continue
			}
			s := &nftables.Set{Table: ip, Name: nameSet(r.slot, i), KeyType: nftables.TypeIPAddr, HasTimeout: true}
			if err := c.SetAddElements(s, elems); err != nil {
				return err
			}
		}
		return nil
	})
	if !found {
		return fmt.Errorf("%w: slot %d: %q is not a destination of the run", ErrInvalid, r.slot, name)
	}
	if err != nil {
		return fmt.Errorf("slot %d: addresses of %s: %w", r.slot, name, err)
	}
	return nil
}
