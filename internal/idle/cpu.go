package idle

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// HostBusyFields names the /proc/stat fields whose sum is the host's busy
// CPU time, the denominator of a sandbox's share (docs/energy.md says why).
const HostBusyFields = "user+nice+system+irq+softirq+steal"

// procfs reports /proc/stat in seconds, dividing the kernel's ticks by a
// USER_HZ of 100; the meter turns them back into whole ticks of 10 ms.
const (
	userHZ = 100
	tickNS = 1e9 / userHZ
)

// hostBusyTicks returns the host's busy CPU time since boot in ticks of
// 10 ms, summed over all CPUs: user, nice, system, irq, softirq and steal.
// (Ticks, not nanoseconds, so that a big host's uptime cannot overflow:
// only an interval's delta is turned into nanoseconds.) guest and guest_nice
// are left out because the kernel already counts them in user and nice;
// idle and iowait are time no CPU was busy.
func hostBusyTicks(fs procfs.FS) (uint64, error) {
	st, err := fs.Stat()
	if err != nil {
		return 0, err
	}
	c := st.CPUTotal
	var ticks uint64
	for _, s := range []float64{c.User, c.Nice, c.System, c.IRQ, c.SoftIRQ, c.Steal} {
		if s < 0 || math.IsNaN(s) || math.IsInf(s, 0) {
			return 0, fmt.Errorf("/proc/stat: cpu field %v out of range", s)
		}
		ticks += uint64(math.Round(s * userHZ))
	}
	return ticks, nil
}

// CgroupMode is the cgroup hierarchy a Meter reads sandbox CPU time from.
type CgroupMode string

// Cgroup modes.
const (
	// CgroupAuto picks v2 when the cgroup root is a unified hierarchy
	// (it holds cgroup.controllers) and v1 when it holds a cpuacct
	// controller directory — the legacy and hybrid layouts. On a hybrid
	// host, container runtimes place tasks in the v1 controllers.
	CgroupAuto CgroupMode = ""
	// CgroupV1 reads <root>/cpuacct/<path>/cpuacct.usage (nanoseconds).
	CgroupV1 CgroupMode = "v1"
	// CgroupV2 reads usage_usec from <root>/<path>/cpu.stat.
	CgroupV2 CgroupMode = "v2"
)

func detectCgroup(root string, mode CgroupMode) (CgroupMode, error) {
	exists := func(p ...string) bool {
		_, err := os.Stat(filepath.Join(append([]string{root}, p...)...))
		return err == nil
	}
	switch mode {
	case CgroupV1, CgroupV2:
		return mode, nil
	case CgroupAuto:
		if exists("cgroup.controllers") {
			return CgroupV2, nil
		}
		if exists("cpuacct", "cpuacct.usage") {
			return CgroupV1, nil
		}
		return "", fmt.Errorf("%w: %s holds neither cgroup.controllers (v2) nor cpuacct/cpuacct.usage (v1)", ErrCgroup, root)
	}
	return "", fmt.Errorf("%w: unknown cgroup mode %q", ErrCgroup, mode)
}

// cgroupFile returns the file holding the CPU time of the cgroup at path
// (relative to the hierarchy, as /proc/<pid>/cgroup gives it).
func cgroupFile(root string, mode CgroupMode, path string) (string, error) {
	if slices.Contains(strings.Split(filepath.ToSlash(path), "/"), "..") {
		return "", fmt.Errorf("%w: cgroup path %q climbs out of the hierarchy", ErrCgroup, path)
	}
	if mode == CgroupV1 {
		return filepath.Join(root, "cpuacct", path, "cpuacct.usage"), nil
	}
	return filepath.Join(root, path, "cpu.stat"), nil
}

// readCgroupNS reads a cgroup's CPU time in nanoseconds from its file.
func readCgroupNS(mode CgroupMode, file string) (uint64, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrCgroup, err)
	}
	if mode == CgroupV1 {
		v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %s: %w", ErrCgroup, file, err)
		}
		return v, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || k != "usage_usec" {
			continue
		}
		us, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %s: usage_usec: %w", ErrCgroup, file, err)
		}
		if us > math.MaxUint64/1000 {
			return 0, fmt.Errorf("%w: %s: usage_usec %d overflows nanoseconds", ErrCgroup, file, us)
		}
		return us * 1000, nil
	}
	return 0, fmt.Errorf("%w: %s: no usage_usec line", ErrCgroup, file)
}

// cgroupOf returns the path of pid's cgroup in the hierarchy mode reads,
// from /proc/<pid>/cgroup: the line naming the cpuacct controller (v1) or
// the line of hierarchy 0 with no controllers (v2).
func cgroupOf(fs procfs.FS, mode CgroupMode, pid int) (string, error) {
	p, err := fs.Proc(pid)
	if err != nil {
		return "", fmt.Errorf("%w: pid %d: %w", ErrCgroup, pid, err)
	}
	cgs, err := p.Cgroups()
	if err != nil {
		return "", fmt.Errorf("%w: pid %d: %w", ErrCgroup, pid, err)
	}
	for _, cg := range cgs {
		if mode == CgroupV1 && slices.Contains(cg.Controllers, "cpuacct") {
			return cg.Path, nil
		}
		if mode == CgroupV2 && cg.HierarchyID == 0 && len(cg.Controllers) == 0 {
			return cg.Path, nil
		}
	}
	return "", fmt.Errorf("%w: pid %d: no %s line in /proc/%d/cgroup", ErrCgroup, pid, mode, pid)
}

var errNoMemTotal = errors.New("/proc/meminfo has no MemTotal")

func memTotalBytes(fs procfs.FS) (uint64, error) {
	mi, err := fs.Meminfo()
	if err != nil {
		return 0, err
	}
	if mi.MemTotalBytes == nil || *mi.MemTotalBytes == 0 {
		return 0, errNoMemTotal
	}
	return *mi.MemTotalBytes, nil
}
