package manifest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Host returns the facts this host can state by itself: kernel release,
// architecture and CPU features, merged with extra (the runtime versions,
// the image digest and the unit id, which the daemon supplies), and the
// CRIU image format of extra's criu.version ([CRIUFormat]). cpuinfo is
// the path of /proc/cpuinfo, overridable for tests.
func Host(cpuinfo string, extra Manifest) (Manifest, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return nil, fmt.Errorf("manifest: uname: %w", err)
	}
	flags, feat, err := CPUOf(cpuinfo)
	if err != nil {
		return nil, err
	}
	m := Manifest{
		KernelRelease: unix.ByteSliceToString(u.Release[:]),
		Arch:          runtime.GOARCH,
		CPUFeatures:   feat,
		CPUFlags:      flags,
	}
	for k, v := range extra {
		m[k] = v
	}
	if v, ok := m[CRIUVersion]; ok {
		m[CRIUImages] = CRIUFormat(v)
	}
	return m, nil
}

// CRIUFormat is the image format a CRIU of version v (MAJOR.MINOR.SUBLEVEL)
// writes, as the criu.images key records it: "criu-images/MAJOR.MINOR".
// CRIU adds image kinds (each with its magic) and message fields in its
// feature releases, MAJOR.MINOR; its SUBLEVEL releases fix bugs and write
// what their feature release writes. The images version CRIU itself puts
// in inventory.img has not changed since CRIU 1.x, so it cannot tell these
// apart, and no CRIU states its list of magics. A version not of that
// shape is its own format, named whole.
func CRIUFormat(v string) string {
	parts := strings.Split(v, ".")
	if len(parts) < 2 || !digits(parts[0]) || !digits(parts[1]) {
		return "criu-images/" + v
	}
	return "criu-images/" + parts[0] + "." + parts[1]
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// CPUOf returns the CPU feature flags of the first processor in a cpuinfo
// file as both keys state them: cpu.flags, the flags sorted, each once,
// joined by single spaces; and cpu.features, the address of the sorted
// flags joined by spaces, as format-1 manifests recorded it. A process may
// use any of the flags, and CRIU refuses to restore an image onto a CPU
// lacking one it may use: a target must have every recorded flag ([Judge]).
func CPUOf(cpuinfo string) (flags, features string, err error) {
	b, err := os.ReadFile(cpuinfo)
	if err != nil {
		return "", "", fmt.Errorf("manifest: cpu features: %w", err)
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
		f := strings.Fields(val)
		sort.Strings(f)
		features = record.Sum([]byte(strings.Join(f, " "))).String()
		return strings.Join(slices.Compact(f), " "), features, nil
	}
	return "", "", fmt.Errorf("manifest: no CPU flags in %s", cpuinfo)
}
