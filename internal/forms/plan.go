package forms

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// SandboxID is the sandbox of a transcript run's interval n. Each interval
// of a transcript run gets its own sandbox id, so the next interval's
// sandbox can start while the last one is still being torn down. An image
// run's sandbox is the run id: its restore takes the place of the one
// checkpointed.
func SandboxID(run string, n int64) string { return fmt.Sprintf("%s_t%d", run, n) }

// TranscriptSuffix is the end of a transcript interval's sandbox id
// (SandboxID): no run id may end so.
var TranscriptSuffix = regexp.MustCompile(`_t[0-9]+$`)

// RunOf is the run a sandbox belongs to.
func RunOf(sid string) string {
	if loc := TranscriptSuffix.FindStringIndex(sid); loc != nil {
		return sid[:loc[0]]
	}
	return sid
}

// newer reports whether sandbox a is a later interval's than b ("" is
// older than anything).
func newer(a, b string) bool {
	if b == "" {
		return true
	}
	return suffixN(a) > suffixN(b)
}

func suffixN(sid string) int64 {
	loc := TranscriptSuffix.FindStringIndex(sid)
	if loc == nil {
		return 0
	}
	n, _ := strconv.ParseInt(sid[loc[0]+2:], 10, 64)
	return n
}

// Plan is what a restarted daemon keeps of containerd's sandboxes.
type Plan struct {
	// Owner is the sandbox each executing run keeps: its own id, or for
	// a transcript run the latest interval's (an earlier one is a
	// teardown that did not finish).
	Owner map[string]string
	// Remove are the sandboxes no executing run owns, in the order given.
	Remove []string
	// Unread are the sandboxes whose run's record could not be read:
	// they are left as they are.
	Unread []Unread
}

// Unread is a sandbox whose run could not be read, and why.
type Unread struct {
	Sandbox string
	Err     error
}

// PlanSandboxes plans what to keep of the sandboxes ids, given each run's
// phase (an error wrapping store.ErrNoRun: no such run). It changes
// nothing.
func PlanSandboxes(ids []string, phase func(run string) (record.Phase, error)) Plan {
	p := Plan{Owner: map[string]string{}}
	unsure := map[string]bool{} // runs whose record could not be read
	for _, sid := range ids {
		run := RunOf(sid)
		ph, err := phase(run)
		switch {
		case err != nil && !errors.Is(err, store.ErrNoRun):
			unsure[run] = true
			p.Unread = append(p.Unread, Unread{Sandbox: sid, Err: err})
		case err == nil && ph == record.PhaseExecuting && newer(sid, p.Owner[run]):
			p.Owner[run] = sid
		}
	}
	for _, sid := range ids {
		if p.Owner[RunOf(sid)] == sid || unsure[RunOf(sid)] {
			continue
		}
		p.Remove = append(p.Remove, sid)
	}
	return p
}
