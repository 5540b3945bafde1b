//go:build linux

package e2e

import (
	"flag"
	"strconv"
	"sync"
	"testing"
)

// The tests run one after the other, but for three groups of tests that
// have daemons of their own, spend most of their time waiting (on CRIU
// deadlines, crashed and restarted daemons, etcd leases) and look at
// nothing the other groups make:
//
//   - TestCrashAtEachStep;
//   - the CRIU-hang tests (TestCRIUDeadline, TestImageParksUnavailable,
//     TestCRIUKilledAfterSeize), which look for a hanging CRIU on the whole
//     host (`sleep 3600`, noStandIn): one at a time (criuHangs);
//   - the fleet tests (every test that calls fleetCluster), which share one
//     etcd cluster and stop its members: one at a time (fleetTests).
//
// They call t.Parallel, so go test runs them once every serial test has
// passed, the three groups beside each other; TestMain lets as many
// parallel tests start as there are (parallelTests), since those waiting
// for their group's lock use no core.
//
// A test that joins them must start its own daemons (mustDaemon or a fleet
// host, never shared or trShared), must not stop etcd members unless it is
// a fleet test, and must not look at processes other than its daemons' —
// or take a lock of its own kind, as the CRIU-hang tests do.
var criuHangs, fleetTests sync.Mutex

// parallelTests is the -parallel TestMain sets when the command line
// gives none: more than the tests that call t.Parallel, so each group's
// next test is waiting on its lock, not for a free slot behind a test
// that waits on a lock.
const parallelTests = 32

// parallelCRIUHang runs t beside the crash test and the fleet tests, after
// the serial tests, and one CRIU-hang test at a time: its daemons are
// stopped, and their hanging CRIUs gone, before the next one starts.
func parallelCRIUHang(t *testing.T) { parallelIn(t, &criuHangs) }

// parallelFleet runs t beside the crash test and the CRIU-hang tests,
// after the serial tests, and one fleet test at a time.
func parallelFleet(t *testing.T) { parallelIn(t, &fleetTests) }

func parallelIn(t *testing.T, group *sync.Mutex) {
	t.Helper()
	t.Parallel()
	group.Lock()
	t.Cleanup(group.Unlock) // the first registered: it runs last
}

// setParallel sets -test.parallel to parallelTests unless the command
// line set it. It parses the flags (m.Run would).
func setParallel() error {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if set {
		return nil
	}
	return flag.Set("test.parallel", strconv.Itoa(parallelTests))
}
