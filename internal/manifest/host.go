package manifest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Host returns the facts this host can state by itself: kernel release,
// architecture and CPU features, merged with extra (the runtime versions,
// the image digest and the unit id, which the daemon supplies). cpuinfo is
// the path of /proc/cpuinfo, overridable for tests.
func Host(cpuinfo string, extra Manifest) (Manifest, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return nil, fmt.Errorf("manifest: uname: %w", err)
	}
	feat, err := CPUFeaturesOf(cpuinfo)
	if err != nil {
		return nil, err
	}
	m := Manifest{
		KernelRelease: unix.ByteSliceToString(u.Release[:]),
		Arch:          runtime.GOARCH,
		CPUFeatures:   feat,
	}
	for k, v := range extra {
		m[k] = v
	}
	return m, nil
}

// CPUFeaturesOf returns the address of the sorted CPU feature flags of the
// first processor in a cpuinfo file: CRIU refuses to restore an image onto
// a CPU lacking features the dumped process could use, so a change in the
// flags is a change in what a restore may rely on.
func CPUFeaturesOf(cpuinfo string) (string, error) {
	b, err := os.ReadFile(cpuinfo)
	if err != nil {
		return "", fmt.Errorf("manifest: cpu features: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		key = strings.TrimSpace(key)
		if key != "flags" && key != "Features" { // x86, arm64
			continue
		}
		flags := strings.Fields(val)
		sort.Strings(flags)
		return record.Sum([]byte(strings.Join(flags, " "))).String(), nil
	}
	return "", fmt.Errorf("manifest: no CPU flags in %s", cpuinfo)
}
