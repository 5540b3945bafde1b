package forms

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestSandboxNames(t *testing.T) {
	if got := SandboxID("r", 3); got != "r_t3" {
		t.Fatalf("SandboxID %s", got)
	}
	for sid, run := range map[string]string{"r": "r", "r_t3": "r", "r_t": "r_t", "r_x1": "r_x1", "a_t1_t2": "a_t1", "r_t12": "r"} {
		if got := RunOf(sid); got != run {
			t.Errorf("RunOf(%s) = %s, want %s", sid, got, run)
		}
	}
}

// What a restarted daemon keeps of containerd's sandboxes: each executing
// run its own id, or a transcript run its latest interval's; everything
// else goes, except the sandboxes of a run whose record cannot be read.
func TestPlanSandboxes(t *testing.T) {
	broken := errors.New("bbolt: read error")
	phases := map[string]record.Phase{"img": record.PhaseExecuting, "tr": record.PhaseExecuting, "parked": record.PhaseParked, "ended": record.PhaseClosed, "big": record.PhaseExecuting}
	phase := func(run string) (record.Phase, error) {
		if run == "unread" {
			return 0, broken
		}
		if p, ok := phases[run]; ok {
			return p, nil
		}
		return 0, fmt.Errorf("run %s: %w", run, store.ErrNoRun)
	}
	for _, c := range []struct {
		name   string
		ids    []string
		owner  map[string]string
		remove []string
		unread []string
	}{
		{"an image run keeps its id", []string{"img"}, map[string]string{"img": "img"}, nil, nil},
		{"a transcript run keeps its latest interval", []string{"tr_t1", "tr_t2"}, map[string]string{"tr": "tr_t2"}, []string{"tr_t1"}, nil},
		{"intervals compare as numbers", []string{"big_t10", "big_t9"}, map[string]string{"big": "big_t10"}, []string{"big_t9"}, nil},
		{"parked, closed and unknown runs keep nothing", []string{"parked", "ended_t4", "ghost"}, map[string]string{}, []string{"parked", "ended_t4", "ghost"}, nil},
		{"an unread run's sandboxes are left", []string{"unread", "unread_t2", "img"}, map[string]string{"img": "img"}, nil, []string{"unread", "unread_t2"}},
		{"nothing", nil, map[string]string{}, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := PlanSandboxes(c.ids, phase)
			var unread []string
			for _, u := range p.Unread {
				if !errors.Is(u.Err, broken) {
					t.Errorf("unread %s: %v", u.Sandbox, u.Err)
				}
				unread = append(unread, u.Sandbox)
			}
			if fmt.Sprint(p.Owner) != fmt.Sprint(c.owner) || !slices.Equal(p.Remove, c.remove) || !slices.Equal(unread, c.unread) {
				t.Fatalf("plan: owner %v remove %v unread %v; want %v %v %v", p.Owner, p.Remove, unread, c.owner, c.remove, c.unread)
			}
		})
	}
}
