// Package idle meters energy: the receipt of each executed interval (§6)
// and the idle energy of each park (§13), every figure labelled
// [record.Measured] or [record.Estimated]. docs/energy.md gives the
// methods, the coefficients with their sources and the unit conversions.
//
// # Intervals
//
// A [Meter] follows the host's RAPL package and DRAM zones (read through
// procfs's sysfs package from class/powercap), host CPU time from
// /proc/stat and a sandbox's CPU time from its cgroup (v1 cpuacct.usage or
// v2 cpu.stat). The daemon calls [Meter.Begin] when a sandbox starts or is
// restored and [Interval.End] when it parks or exits, and gets an
// [attest.Receipt]:
//
//   - measured, method "rapl-share": the zones' energy over the interval ×
//     the sandbox's CPU time / the host's busy CPU time over the same
//     window;
//   - estimated, method "cpu-time-coefficient": the sandbox's CPU time ×
//     [Coefficients].CPUWatts, with the reason measurement was not possible
//     under the input "fallback".
//
// # Wraps
//
// A RAPL counter wraps at max_energy_range_uj, within minutes on a busy
// host. [Meter.Run] samples every zone each Period and accumulates the
// deltas modulo the range into a monotonic total per zone, so a wrap
// between two samples is never lost. A counter that cannot be read (a
// missing file, one that does not parse, a directory where the file should
// be), or a gap between samples longer than MaxGap, is a fault of its zone:
// an interval across a fault is estimated and names the fault, and
// [Meter.Snapshot] reports it.
//
// # Idle energy
//
// [Estimate] prices what a park retained: retained bytes × a storage
// coefficient × parked time, plus resident bytes × a DRAM coefficient ×
// parked time, computed exactly with math/big and rounded up, so a park
// that kept anything for any time is never zero. [Meter.BeginPark] and
// [Park.End] measure the resident part from the RAPL DRAM zones where the
// host has them.
//
// # Caveats
//
// Host CPU time has the 10 ms resolution of /proc/stat, so a sandbox's
// share over a very short window is coarse; a share above one is capped
// and marked "cpu_share_capped". Attribution spreads the package's idle
// power over busy time, as the estimate's coefficient does. The kernel
// lets only root read energy_uj (since the PLATYPUS fix, CVE-2020-8694);
// another user gets estimated receipts naming the permission error.
package idle
