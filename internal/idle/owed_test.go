package idle

import (
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// A park this process did not see is estimated; one that retained nothing
// for no time is floored at 1 µJ, and says so.
func TestOwed(t *testing.T) {
	c := DefaultCoefficients()
	got, prov := Owed(nil, 1<<30, time.Hour, c)
	uj, _, _ := Estimate(1<<30, 0, time.Hour, c)
	if prov != record.Estimated || got.UJ != uj || got.RetainedBytes != 1<<30 || got.ParkedNS != int64(time.Hour) || got.Provenance != "estimated" {
		t.Fatalf("an hour's park of 1 GiB: %+v (%s), want %d µJ estimated", got, prov, uj)
	}
	got, _ = Owed(nil, 0, 0, c)
	if got.UJ != 1 || got.Inputs["floor"] != "1" {
		t.Fatalf("an empty park: %+v, want 1 µJ floored", got)
	}
}
