package calls

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// journalOf stores a journal of an interval that dispatched calls (each
// {"id":…,"kind":"build","payload":{"n":…}}) and then awaited await, and
// its attestation.
func journalOf(t *testing.T, st *store.Store, interval uint64, calls []string, await string) (record.Address, record.Address) {
	t.Helper()
	j := attest.Journal{}
	j.Add(attest.Lifecycle, 1, []byte("started"))
	j.Add(attest.Transcript, 2, []byte("step 1\n"))
	for i, id := range calls {
		j.Add(attest.Dispatch, int64(3+i), []byte(`{"id":"`+id+`","kind":"build","payload":{"n":`+string(rune('1'+i))+`}}`))
	}
	if await != "" {
		j.Add(attest.Lifecycle, 9, []byte("await "+await))
	}
	j.Add(attest.Stdout, 10, []byte("out"))
	jAddr := put(t, st, string(j.Encode()))
	return sign(t, st, interval, jAddr), jAddr
}

// The upgrade from a daemon before the ledger, on a state directory made
// by hand as that daemon left it: the store migrated (the ledger holds the
// record's calls, without kinds, call objects or the await), the journals
// hold the dispatches and the await, and results/RUN holds the results
// posted, one file per call named by resultName (or, older, the id in
// base64), beside a temporary file a crash left and the directories of
// runs closed or gone. The upgrade posts each result to the ledger, fills
// every call in from its journal, with the await, and removes results/;
// started again, it reads no journal.
func TestUpgradeLegacyLayout(t *testing.T) {
	st := mustStore(t)
	long := strings.Repeat("i", protocol.MaxIDLen)
	newRun(t, st, "r")
	att, journal := journalOf(t, st, 1, []string{"c1", "c2", "c3", long}, `["c1","c2",`+`"`+long+`"]`)
	appendSegs(t, st, "r", record.Execution(att, &record.CallAccount{Dispatched: []string{"c1", "c2", "c3", long}}),
		record.Suspension(record.TranscriptSnapshot(put(t, st, "transcript")), put(t, st, "manifest")))
	newRun(t, st, "closed")
	appendSegs(t, st, "closed", record.Closure("done"))

	dir := filepath.Join(t.TempDir(), "results")
	legacy := func(run, name, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, run), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, run, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	legacy("r", resultName("c1"), `{"r": 1}`)
	legacy("r", base64.RawURLEncoding.EncodeToString([]byte("c3")), `{"r":3}`)
	legacy("r", resultName(long), `"long"`)
	legacy("r", ".tmp-123", `{"half`)
	legacy("r", resultName("never-dispatched"), `{}`)
	legacy("closed", resultName("c1"), `{}`)
	legacy("gone", resultName("c1"), `{}`)
	if err := os.WriteFile(filepath.Join(dir, "stray"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	if err := Upgrade(st, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("results/ after the upgrade: %v", err)
	}
	l, err := st.Calls("r")
	if err != nil || !l.AwaitKnown || len(l.Calls) != 4 {
		t.Fatalf("ledger %+v %v", l, err)
	}
	posted := map[string]string{"c1": `{"r": 1}`, "c3": `{"r":3}`, long: `"long"`}
	for _, c := range l.Calls {
		if c.Kind != "build" || c.Awaited != (c.ID != "c3") {
			t.Errorf("call %.8s: %+v", c.ID, c)
		}
		b, err := st.ReadAll(c.Payload)
		if err != nil || !strings.HasPrefix(string(b), `{"id":"`+c.ID+`","kind":"build","payload":{"n":`) {
			t.Errorf("call %.8s's object: %s %v", c.ID, b, err)
		}
		if want, ok := posted[c.ID]; ok {
			if r, err := st.ReadAll(c.Result); c.State != store.CallPosted || err != nil || string(r) != want {
				t.Errorf("call %.8s: %s, result %s %v", c.ID, c.State, r, err)
			}
		} else if c.State != store.CallOutstanding {
			t.Errorf("call %.8s: %s", c.ID, c.State)
		}
	}
	wantAwaiting(t, st, "r", "c2")
	if got := listed(t, st); !strings.Contains(got, `r/c2(parked):build={"n":2}`) || strings.Count(got, "+") != 3 {
		t.Fatalf("listed %s", got)
	}
	// Again: nothing to bring in, and no journal is read (it is gone).
	if err := os.Chmod(st.Path(journal), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(st.Path(journal)); err != nil {
		t.Fatal(err)
	}
	if err := Upgrade(st, dir); err != nil {
		t.Fatalf("the second upgrade: %v", err)
	}
	// (The journal the record names is gone; put it back for the
	// cleanup's check.)
	journalOf(t, st, 1, []string{"c1", "c2", "c3", long}, `["c1","c2",`+`"`+long+`"]`)
}

// A run imported from another host gets its calls' kinds and call
// objects, and its await, from the journals the bundle carried; a run
// whose last interval awaited nothing the journal says awaits every
// outstanding call.
func TestFillImported(t *testing.T) {
	st := mustStore(t)
	snap := record.TranscriptSnapshot(put(t, st, "transcript"))
	man := put(t, st, "manifest")
	for _, c := range []struct {
		id, await string
		want      []string
	}{
		{"awaits-one", `["d2"]`, []string{"d2"}},
		{"awaits-none", "", []string{"d1", "d2"}},
	} {
		att, _ := journalOf(t, st, 1, []string{"d1", "d2"}, c.await)
		r := record.New(record.Sum([]byte(c.id)), record.Sum([]byte("g")))
		for _, seg := range []record.Segment{record.Execution(att, &record.CallAccount{Dispatched: []string{"d1", "d2"}}), record.Suspension(snap, man)} {
			if _, err := r.Append(seg); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Import(c.id, r); err != nil {
			t.Fatal(err)
		}
		if got := listed(t, st); !strings.Contains(got, c.id+`/d1(parked):= `) {
			t.Fatalf("before the fill: %s", got)
		}
		if err := Fill(st, c.id); err != nil {
			t.Fatal(err)
		}
		if got := listed(t, st); !strings.Contains(got, c.id+`/d1(parked):build={"n":1}`) {
			t.Fatalf("after the fill: %s", got)
		}
		wantAwaiting(t, st, c.id, c.want...)
		if l, _ := st.Calls(c.id); !l.AwaitKnown {
			t.Fatalf("%s: the await is not known after the fill", c.id)
		}
	}
}

// TestResultName: every call id the protocol takes names a result file
// within NAME_MAX, distinct from every other's: the names a daemon before
// the ledger gave its results.
func TestResultName(t *testing.T) {
	a, b := strings.Repeat("i", protocol.MaxIDLen), strings.Repeat("i", protocol.MaxIDLen-1)+"j"
	if len(resultName(a)) > 255 || resultName(a) == resultName(b) {
		t.Fatalf("%q, %q", resultName(a), resultName(b))
	}
	if _, ok := legacyResultName(a); ok {
		t.Fatal("a 256-byte id has a base64 name within NAME_MAX")
	}
	if n, ok := legacyResultName("c3"); !ok || n != "YzM" {
		t.Fatalf("legacy name of c3: %s %v", n, ok)
	}
}
