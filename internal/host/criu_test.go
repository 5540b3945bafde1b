package host

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// build is a CRIU build that can do what it lists.
type build []criu.Capability

func (b build) Has(c criu.Capability) bool { return slices.Contains(b, c) }

func (b build) Lacks(c criu.Capability) string {
	if b.Has(c) {
		return ""
	}
	return "lacks deploy/criu/" + criu.Patch(c)
}

// TestFastPaths: each fast path the build cannot take is turned off,
// named with the patch it needs, in the log too; what the build can do,
// or what no flag asked for, is left as it was.
func TestFastPaths(t *testing.T) {
	all := build{criu.KeepsUffds, criu.UsernsUffd, criu.TasksKeepUffds}
	lazy := Config{LazyResume: true, LazyServed: true, UserNS: true}
	cases := []struct {
		name string
		cfg  Config
		b    build
		want Config
		off  []string
	}{
		{"every patch", lazy, all, lazy, nil},
		{"no patch 2", lazy, build{criu.UsernsUffd, criu.TasksKeepUffds},
			Config{LazyResume: true, UserNS: true},
			[]string{"--lazy-served: lacks deploy/criu/2-lazy-pages-keep-uffds.patch"}},
		{"no patch 5", lazy, build{criu.KeepsUffds, criu.TasksKeepUffds},
			Config{UserNS: true},
			[]string{"--lazy-resume: lacks deploy/criu/5-lazy-pages-userns-uffd.patch", "--lazy-served: off with --lazy-resume"}},
		{"no patch", lazy, nil,
			Config{UserNS: true},
			[]string{"--lazy-resume: lacks deploy/criu/5-lazy-pages-userns-uffd.patch", "--lazy-served: lacks deploy/criu/2-lazy-pages-keep-uffds.patch"}},
		{"no patch, not served", Config{LazyResume: true, UserNS: true}, nil,
			Config{UserNS: true},
			[]string{"--lazy-resume: lacks deploy/criu/5-lazy-pages-userns-uffd.patch"}},
		{"no patch 8", lazy, build{criu.KeepsUffds, criu.UsernsUffd},
			Config{UserNS: true},
			[]string{"--lazy-resume: lacks deploy/criu/8-restored-tasks-keep-uffds.patch", "--lazy-served: off with --lazy-resume"}},
		{"no patch 8, no user namespaces", Config{LazyResume: true}, build{criu.KeepsUffds},
			Config{}, []string{"--lazy-resume: lacks deploy/criu/8-restored-tasks-keep-uffds.patch"}},
		{"no patch 5, no user namespaces", Config{LazyResume: true, LazyServed: true}, build{criu.KeepsUffds, criu.TasksKeepUffds},
			Config{LazyResume: true, LazyServed: true}, nil},
		{"no patch, eager", Config{UserNS: true}, nil, Config{UserNS: true}, nil},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		cfg := c.cfg
		off := fastPaths(&cfg, c.b, slog.New(slog.NewTextHandler(&buf, nil)))
		if cfg != c.want || !slices.Equal(off, c.off) {
			t.Errorf("%s: %+v, off %q; want %+v, off %q", c.name, cfg, off, c.want, c.off)
		}
		for _, o := range off {
			flag, _, _ := strings.Cut(o, ":")
			if !strings.Contains(buf.String(), flag+" turned off") {
				t.Errorf("%s: the log does not say %s was turned off:\n%s", c.name, flag, buf.String())
			}
		}
	}
}

// TestCheckLazy: where no CRIU can restore lazily, --lazy-resume at its
// default is turned off, --lazy-served with it, each logged and named;
// given (LazyGiven), the host refuses to open; off, nothing is asked.
func TestCheckLazy(t *testing.T) {
	noCRIU := errors.New("executor: missing: criu: not found")
	cases := []struct {
		name string
		cfg  Config
		want Config
		off  []string
		err  bool
	}{
		{"default", Config{LazyResume: true, LazyServed: true, UserNS: true}, Config{UserNS: true},
			[]string{"--lazy-resume: no CRIU answered at start", "--lazy-served: off with --lazy-resume"}, false},
		{"default, not served", Config{LazyResume: true}, Config{},
			[]string{"--lazy-resume: no CRIU answered at start"}, false},
		{"given", Config{LazyResume: true, LazyGiven: true, LazyServed: true}, Config{LazyResume: true, LazyGiven: true, LazyServed: true}, nil, true},
		{"off", Config{}, Config{}, nil, false},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		c.cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		h := &Host{Config: c.cfg, CRIUErr: noCRIU}
		err := h.checkLazy(context.Background())
		if (err != nil) != c.err || (err != nil && !errors.Is(err, noCRIU)) {
			t.Errorf("%s: %v, want an error %v", c.name, err, c.err)
		}
		h.Config.Logger = nil
		if h.Config != c.want || !slices.Equal(h.CRIUOff, c.off) {
			t.Errorf("%s: %+v, off %q; want %+v, off %q", c.name, h.Config, h.CRIUOff, c.want, c.off)
		}
		for _, o := range h.CRIUOff {
			flag, _, _ := strings.Cut(o, ":")
			if !strings.Contains(buf.String(), flag+" turned off") {
				t.Errorf("%s: the log does not say %s was turned off:\n%s", c.name, flag, buf.String())
			}
		}
	}
}
