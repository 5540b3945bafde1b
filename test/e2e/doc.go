//go:build linux

// Package e2e holds runrecordd's end-to-end tests: the real daemon binary,
// started as `runrecordd serve` on a private state directory with its
// embedded containerd, driving real runc and CRIU as root, talked to through
// pkg/api's client. Nothing is mocked.
//
// # What the tests prove
//
//   - TestImageParkResumeTwice: a state oracle (units/oracle) parked and
//     resumed twice goes on as the same process with the same state, and
//     `show` carries both parks' CRIU statistics, the estimated idle energy
//     of both resumes and totals that add up.
//   - TestResumeOnSecondHost: a run exported from one daemon resumes on a
//     fresh one once, and only once, the image it names is there.
//   - TestRefusals: a flipped byte in the memory image, a changed manifest
//     key, an edited segment and an append after close are each refused
//     with their own error, leave the record as it was, and (but for the
//     closed run) resume once the input is put right.
//   - TestIdleEnergy: a park of a few seconds costs idle energy consistent
//     with retained bytes × the storage coefficient × parked time.
//   - TestDaemonRestart: a daemon stopped with SIGTERM under a running unit
//     exits 0 and leaves the unit running; started again it reattaches to
//     it, park and resume still work, and the interval that spanned the
//     restart is attested whole.
//   - TestTranscriptAgentThreeCycles: the demo agent's three dispatch/await
//     cycles park it by its transcript each time (nothing resident, its
//     CPU time still while it waits) and resume it when the result is
//     posted; the accounts are exact and the wait proof NonBlocking.
//   - TestTranscriptPollerBlocked: a unit that polls for its own result
//     inside its interval yields Blocked naming that segment.
//   - TestTranscriptRefusals, TestTranscriptResultBeforePark: results for
//     unknown, resolved or already answered calls are refused and change
//     nothing; a result posted as the unit awaits still resumes it.
//   - TestTranscriptOnSecondHost, TestTranscriptBundleFromBusyHost: a parked
//     transcript run's bundle carries no image data and finishes on a
//     second fresh daemon, both hosts' segments verifying as one record.
//   - TestTranscriptWatch: the event stream gives the transitions in order.
//   - TestCrashAtEachStep: the daemon SIGKILLed at each failpoint
//     (internal/failpoint's Steps) leaves a store that passes fsck with the
//     run where docs/daemon.md's ordering says; the next start keeps or
//     destroys the sandbox accordingly, and the run goes on as the same
//     process to a normal end.
//
// # Invariants checked after every test
//
// Every run a test starts is verified from genesis (record and every
// object it reaches) and closed, so its sandbox is destroyed; every daemon
// a test starts is stopped with SIGTERM and must exit 0, leaving no
// containerd or shim process behind.
//
// # Running
//
// As root, on a host with containerd, runc and a CRIU whose `criu check`
// passes (deploy/setup.sh): `go test -count=1 -v ./test/e2e/`. Without
// them TestMain fails, saying why; RUNRECORDD_SKIP_PRIVILEGED=1 skips every
// test instead, saying so. A failed test keeps its daemons' state
// directories and logs and prints where they are.
//
// The tests run one at a time but for two groups, the crash tests (daemon
// killed at a failpoint, CRIU hung) and the fleet tests, which run beside
// each other once the others have passed (parallel_test.go).
package e2e
