//go:build linux

package e2e

import (
	"flag"
	"strconv"
	"sync"
	"testing"
)

// The tests run one after the other, but for two groups of tests that
// have daemons of their own, spend most of their time waiting (on CRIU
// deadlines, crashed and restarted daemons, etcd leases) and look at
// nothing the other group makes:
//
//   - the crash tests: TestCrashAtEachStep and the CRIU-hang tests
//     (TestCRIUDeadline, TestImageParksUnavailable, TestCRIUKilledAfterSeize),
//     which look for a hanging CRIU on the whole host (`sleep 3600`,
//     noStandIn);
//   - the fleet tests (every test that calls fleetCluster), which share one
//     etcd cluster and stop its members.
//
// Two more kinds ride along, one group each, to keep the groups about as
// long: the chunked-image test with the crash tests, the lazy-resume tests
// (each finds only its own run's lazy-pages) with the fleet tests.
//
// They call t.Parallel, so go test runs them once every serial test has
// passed, the two groups beside each other and the tests of a group one
// at a time (crashTests, fleetTests). The fleet tests take about as long
// as the crash tests (60 s each, measured); the crash tests are one group,
// not two, so that no more than two tests park, crash or hang CRIU at once
// (with three groups, and three packages at once beside them, a park once
// failed to freeze its unit in time). TestMain
// lets as many parallel tests start as there are (parallelTests), since
// those waiting for their group's lock use no core.
//
// A test that joins a group must start its own daemons (mustDaemon or a
// fleet host, never shared or trShared), must not stop etcd members unless
// it is a fleet test, and must not look at processes other than its
// daemons' but as its group's lock allows.
var crashTests, fleetTests sync.Mutex

// parallelTests is the -parallel TestMain sets when the command line
// gives none: more than the tests that call t.Parallel, so each group's
// next test is waiting on its lock, not for a free slot behind a test
// that waits on a lock.
const parallelTests = 32

// parallelCrash runs t beside the fleet tests, after the serial tests,
// and one crash test at a time: its daemons are stopped, and their hanging
// CRIUs gone, before the next one starts.
func parallelCrash(t *testing.T) { parallelIn(t, &crashTests) }

// parallelFleet runs t beside the crash tests, after the serial tests, and
// one fleet test at a time.
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
