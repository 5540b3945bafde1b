package idle

import (
	"reflect"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Without residency OwedWith is Owed; with it, idle_uj includes it and
// the inputs label the warm pool's part apart.
func TestOwedWithResidency(t *testing.T) {
	c := DefaultCoefficients()
	base, bprov := Owed(nil, 1<<20, time.Hour, c)
	same, sprov := OwedWith(nil, 1<<20, time.Hour, c, Residency{})
	if !reflect.DeepEqual(base, same) || bprov != sprov {
		t.Fatalf("without residency: %+v, want %+v", same, base)
	}
	var w Residency
	w.Add(Residency{UJ: 700, NS: 5e9, Bytes: 8 << 20, Sandboxes: 1, Estimated: 1})
	w.Add(Residency{UJ: 300, NS: 1e9, Bytes: 4 << 20, Sandboxes: 1})
	got, prov := OwedWith(nil, 1<<20, time.Hour, c, w)
	if got.UJ != base.UJ+1000 || prov != record.Estimated || got.Provenance != "estimated" {
		t.Fatalf("with residency: %d %s, want %d estimated", got.UJ, prov, base.UJ+1000)
	}
	for k, v := range map[string]string{"warm_pool": "estimated", "warm_pool_uj": "1000", "warm_pool_ns": "6000000000",
		"warm_pool_resident_bytes": "8388608", "warm_pool_sandboxes": "2", "method": base.Inputs["method"]} {
		if got.Inputs[k] != v {
			t.Errorf("input %s = %q, want %q", k, got.Inputs[k], v)
		}
	}
	if _, ok := base.Inputs["warm_pool"]; ok {
		t.Fatal("Owed's inputs were changed")
	}
}

// A warm sandbox's residency, on a host without RAPL, is estimated from
// the DRAM coefficient over the time it was held.
func TestResidentEstimated(t *testing.T) {
	m, err := NewMeter(Config{SysfsRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	r := m.BeginResident()
	got := r.End(1 << 30)
	if got.Sandboxes != 1 || got.Estimated != 1 || got.Bytes != 1<<30 || got.UJ == 0 {
		t.Fatalf("residency %+v", got)
	}
	if (*Resident)(nil).End(1).Sandboxes != 0 {
		t.Fatal("a nil residency counted")
	}
}
