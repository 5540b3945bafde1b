package egress

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// A destination by name reaches the addresses given for it, on its
// ports, until their time ends; renewed, they stay.
func TestNames(t *testing.T) {
	w := newWorld(t, Config{})
	serve(t, w.wns, worldIP+":8080")
	serve(t, w.wns, worldIP+":8081")
	r, s := w.sandbox(1, "world.example:8080", "other.example:8081")
	if got := r.Names(); len(got) != 2 || got[0] != "other.example" || got[1] != "world.example" {
		t.Errorf("names %v", got)
	}
	if c, _, err := dial(s, "", worldIP+":8080"); err == nil {
		c.Close()
		t.Fatal("a name not resolved yet: its address was reached")
	}
	world := netip.MustParseAddr(worldIP)
	if err := r.Allowed("world.example", []netip.Addr{world}, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	c, _, err := dial(s, "", worldIP+":8080")
	if err != nil {
		t.Fatalf("resolved: %v", err)
	}
	c.Close()
	if c, _, err := dial(s, "", worldIP+":8081"); err == nil {
		c.Close()
		t.Error("another name's port was reached through this name's address")
	}
	if err := r.Allowed("pypi.org", []netip.Addr{world}, time.Minute); !errors.Is(err, ErrInvalid) {
		t.Errorf("a name the run was not granted: %v", err)
	}
	time.Sleep(2 * time.Second)
	if c, _, err := dial(s, "", worldIP+":8080"); err == nil {
		c.Close()
		t.Fatal("reached after the address's time ended")
	}
	// Renewed: the later, longer time counts.
	if err := r.Allowed("world.example", []netip.Addr{world}, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := r.Allowed("world.example", []netip.Addr{world}, time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	c, _, err = dial(s, "", worldIP+":8080")
	if err != nil {
		t.Fatalf("renewed for a minute, gone after 1.5 s: %v", err)
	}
	c.Close()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if l := w.leftovers(); len(l) > 0 {
		t.Fatalf("after close: %v", l)
	}
	if err := r.Allowed("world.example", []netip.Addr{world}, time.Minute); !errors.Is(err, ErrClosed) {
		t.Errorf("a closed run: %v", err)
	}
}

// A run's sets are removed by a reconcile that finds no run owning it,
// and a new policy in the slot begins with its sets empty.
func TestNamesReconciled(t *testing.T) {
	w := newWorld(t, Config{})
	serve(t, w.wns, worldIP+":8080")
	r, _ := w.sandbox(2, "world.example:8080")
	if err := r.Allowed("world.example", []netip.Addr{netip.MustParseAddr(worldIP)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	// The same slot given to another run without a close (a crash):
	// the set starts empty.
	_, s := w.sandbox(2, "world.example:8080")
	if c, _, err := dial(s, "", worldIP+":8080"); err == nil {
		c.Close()
		t.Fatal("a new policy in the slot inherited the old run's addresses")
	}
	left := strings.Join(w.leftovers(), "; ")
	if !strings.Contains(left, "set of slot 2") {
		t.Fatalf("no set found: the check is blind (%s)", left)
	}
	if err := w.host.Reconcile(func(int) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if l := w.leftovers(); len(l) > 0 {
		t.Fatalf("after reconcile: %v", l)
	}
}
