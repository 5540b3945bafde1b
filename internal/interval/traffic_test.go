package interval

import (
	"strings"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// counters is a Traffic whose counts the test sets: a run not in it holds
// no link.
type counters struct {
	mu sync.Mutex
	m  map[string]Counters
}

func (c *counters) set(run string, n Counters) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]Counters{}
	}
	c.m[run] = n
}

func (c *counters) Counters(run string) (Counters, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.m[run]
	return n, ok, nil
}

// The interval's traffic is its counters' growth from its mark, across a
// restarted daemon's reattach; counters below the mark say they were
// reset; a run without a link has no traffic entry.
func TestTrafficJournaled(t *testing.T) {
	for _, tc := range []struct {
		name       string
		start, end *Counters
		want       *attest.Traffic
	}{
		{"grown", &Counters{100, 1, 50, 1}, &Counters{1100, 11, 250, 3}, &attest.Traffic{InBytes: 1000, InPackets: 10, OutBytes: 200, OutPackets: 2}},
		{"linked after the mark", nil, &Counters{700, 7, 70, 1}, &attest.Traffic{InBytes: 700, InPackets: 7, OutBytes: 70, OutPackets: 1}},
		{"reset", &Counters{100, 1, 50, 1}, &Counters{40, 2, 60, 2}, &attest.Traffic{InBytes: 40, InPackets: 2, OutBytes: 60, OutPackets: 2, Reset: true}},
		{"no link", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, th, log := newTestHost(t)
			var tr counters
			h.Traffic = &tr
			th.Start(t, "r")
			if tc.start != nil {
				tr.set("r", *tc.start)
			}
			sb := pidSandbox{pid: 4243}
			iv := h.Begin("r", sb, unit.Limits{}, "started", h.MarkNow("r"))
			h.SaveMark(iv)
			if tc.end != nil {
				tr.set("r", *tc.end)
			}
			iv = h.Reattach("r", sb, unit.Limits{})
			last := attest.Event(1, "checkpointed")
			sealed, err := h.End(t.Context(), iv, nil, Ending{Outcome: attest.Outcome{Kind: attest.Running}, Calls: &record.CallAccount{}, Extra: []attest.Entry{last}})
			if err != nil {
				t.Fatal(err)
			}
			b, err := th.Store.ReadAll(sealed.Attestation)
			if err != nil {
				t.Fatal(err)
			}
			body, err := attest.Open(b, nil)
			if err != nil {
				t.Fatal(err)
			}
			jb, err := th.Store.ReadAll(body.Journal)
			if err != nil {
				t.Fatal(err)
			}
			j, err := attest.DecodeJournal(jb)
			if err != nil {
				t.Fatal(err)
			}
			var got []attest.Traffic
			for _, e := range j.Entries {
				if e.Kind == attest.TrafficKind {
					tr, err := attest.DecodeTraffic(e.Data)
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, tr)
				}
			}
			n := len(j.Entries)
			switch {
			case tc.want == nil && (len(got) != 0 || sealed.Traffic != nil):
				t.Fatalf("traffic %+v, sealed %+v; want none", got, sealed.Traffic)
			case tc.want != nil && (len(got) != 1 || got[0] != *tc.want || sealed.Traffic == nil || *sealed.Traffic != *tc.want):
				t.Fatalf("traffic %+v, sealed %+v; want %+v", got, sealed.Traffic, *tc.want)
			case tc.want != nil && j.Entries[n-2].Kind != attest.TrafficKind:
				t.Fatalf("the traffic entry is not just before the ending's: %+v", j.Entries)
			case string(j.Entries[n-1].Data) != "checkpointed":
				t.Fatalf("the ending's entry is not last: %+v", j.Entries)
			case strings.Contains(log.String(), "level=ERROR"):
				t.Fatalf("errors: %s", log)
			}
		})
	}
}
