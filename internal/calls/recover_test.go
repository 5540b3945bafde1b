package calls

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/protocol"
)

// A transcript a dead daemon's unit left is stored as it is; one the unit
// replaced with a symlink is refused, and its directory removed.
func TestRecover(t *testing.T) {
	state := t.TempDir()
	st, err := store.Open(filepath.Join(state, "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, run := range []string{"kept", "linked"} {
		if err := os.MkdirAll(ChannelDir(state, run), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	body := []byte(`{"v":1}` + "\n")
	if err := os.WriteFile(filepath.Join(ChannelDir(state, "kept"), protocol.TranscriptFile), body, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Recover(t.Context(), st, state, "kept", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.ReadAll(a); err != nil || string(got) != string(body) {
		t.Fatalf("stored %q (%v), want %q", got, err, body)
	}
	if _, err := Recover(t.Context(), st, state, "kept", 3); !errors.Is(err, ErrTranscript) {
		t.Fatalf("a transcript over the limit: %v", err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(ChannelDir(state, "linked"), protocol.TranscriptFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Recover(t.Context(), st, state, "linked", 1<<20); !errors.Is(err, ErrTranscript) {
		t.Fatalf("a symlinked transcript: %v", err)
	}
	if _, err := os.Stat(ChannelDir(state, "linked")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused channel directory is still there: %v", err)
	}
}
