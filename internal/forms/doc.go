// Package forms is the daemon's room for the two ways a unit parks and
// resumes: its image (CRIU, internal/park) and its transcript (the unit's
// channel, internal/calls). Each is a [Form]: it starts a run's sandbox,
// takes the snapshot of a frozen unit ([Taken]: the snapshot, the bytes it
// retains, the manifest keys the form records, the lifecycle entries the
// interval journals), undoes a park that was refused ([Form.Thaw]), wakes a
// parked run ([Woken]: a sandbox and what the resume journals), and says
// what to do with a unit the last daemon process left executing. The
// daemon's Start, Park, Resume and Close sequences call the form of a
// run's mode ([Env.For]) and never branch on the mode themselves.
//
// A [Unit] is one sandbox of a run, with the transcript form's channel for
// the interval (nil for an image unit, and for a transcript unit whose
// channel was another process's). It keeps no form: the daemon asks the
// form of the run's mode at each use, over an [Env] made then.
//
// The room consumes the executor through two role interfaces declared
// here ([Sandbox], [Sandboxes]); *executor.Client is the production
// implementation (through the daemon's adapter), and the daemon's unit
// tests use an in-memory fake.
//
// [Env.Admit] reads a parked run and checks the resume preconditions
// (internal/resume) before a wake, [Env.Manifest] stores the environment
// manifest a park records, and [Env.Prepare] makes a run request's unit
// ready to run. The room also names the sandboxes ([SandboxID], [RunOf])
// and plans what a restarted daemon keeps of them ([PlanSandboxes]), a
// pure function of containerd's sandbox ids and the runs' phases.
package forms
