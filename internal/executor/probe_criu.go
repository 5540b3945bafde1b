//go:build linux

package executor

import (
	"bytes"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// probeMarks are the lines CRIU's logs (level 4, as runc and the probe run
// it) hold when a deploy/criu patch did its work: the container probe's
// /dev, /dev/shm and /run are small tmpfs mounts, dumped and restored in
// CRIU's own process by patches 4 and 3, through tar without them.
var probeMarks = []struct {
	c    criu.Capability
	line string
}{
	{criu.TmpfsDump, "dumped without tar"},
	{criu.TmpfsRestore, "restored without tar"},
}

// seenInLogs is what the probe's CRIU logs show the build doing.
func seenInLogs(logs []byte) []criu.Capability {
	var out []criu.Capability
	for _, m := range probeMarks {
		if bytes.Contains(logs, []byte(m.line)) {
			out = append(out, m.c)
		}
	}
	return out
}
