package interval

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/attest"
)

// TestJournalOutputBounded: an interval's journal keeps the last
// JournalOutputMax bytes of a stream and says what it left out.
func TestJournalOutputBounded(t *testing.T) {
	p := t.TempDir() + "/stdout"
	data := make([]byte, JournalOutputMax+100_000+7)
	for i := range data {
		data[i] = byte(i % 251)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var j attest.Journal
	if err := appendOutput(&j, attest.Stdout, p, 5); err != nil {
		t.Fatal(err)
	}
	var kept []byte
	for _, e := range j.Entries[1:] {
		if e.Kind != attest.Stdout {
			t.Fatalf("entry of kind %d after the omission note", e.Kind)
		}
		kept = append(kept, e.Data...)
	}
	if !bytes.Equal(kept, data[len(data)-JournalOutputMax:]) {
		t.Fatalf("kept %d bytes, not the last %d", len(kept), JournalOutputMax)
	}
	want := fmt.Sprintf(`output-omitted {"stream":1,"from_offset":5,"bytes":%d}`, len(data)-5-JournalOutputMax)
	if e := j.Entries[0]; e.Kind != attest.Lifecycle || string(e.Data) != want {
		t.Fatalf("first entry %d %q, want the omission %q", e.Kind, e.Data, want)
	}

	// Under the bound, everything from the offset, and no note.
	j = attest.Journal{}
	if err := os.WriteFile(p, data[:1000], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := appendOutput(&j, attest.Stdout, p, 10); err != nil {
		t.Fatal(err)
	}
	if len(j.Entries) != 1 || !bytes.Equal(j.Entries[0].Data, data[10:1000]) {
		t.Fatalf("got %d entries", len(j.Entries))
	}
}
