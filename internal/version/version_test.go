package version

import (
	"runtime/debug"
	"testing"
)

func TestGet(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}}
	read := func() (*debug.BuildInfo, bool) { return bi, true }
	if got := get("", read); got.Version != "v1.2.3" || got.Revision != "abc+dirty" || got.Go != "go1.99" {
		t.Fatalf("from the build info: %+v", got)
	}
	if got := get("v9", read); got.Version != "v9" {
		t.Fatalf("-ldflags must win over the build info: %+v", got)
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	if got := get("", none); got.Version != "unknown" || got.Go == "" {
		t.Fatalf("without build info: %+v", got)
	}
	if got := Get(); got.Version == "" || got.Go == "" {
		t.Fatalf("this test binary: %+v", got)
	}
}
