package executor

import (
	"context"
	"errors"
	"testing"
)

// freeze tries again, after a pause, only while runc says it was unable
// to freeze, and at most freezeTries times.
func TestFreezeRetries(t *testing.T) {
	unable := errors.New("runc did not terminate successfully: exit status 1: unable to freeze")
	other := errors.New("cgroup gone")
	cases := []struct {
		name  string
		fails []error // pause's answers before it succeeds
		calls int
		want  error
	}{
		{"first try", nil, 1, nil},
		{"frozen on the third", []error{unable, unable}, 3, nil},
		{"never frozen", []error{unable, unable, unable, unable, unable}, freezeTries, unable},
		{"another error", []error{other, unable}, 1, other},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			err := freeze(t.Context(), func(context.Context) error {
				calls++
				if calls <= len(c.fails) {
					return c.fails[calls-1]
				}
				return nil
			})
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) || calls != c.calls {
				t.Fatalf("freeze: %v after %d tries; want %v after %d", err, calls, c.want, c.calls)
			}
		})
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := freeze(ctx, func(context.Context) error { return unable })
	if !errors.Is(err, unable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("freeze with ctx done: %v", err)
	}
}
