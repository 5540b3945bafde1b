// Package executor runs units in containerd sandboxes and checkpoints and
// restores them with CRIU: images, containers, tasks and their cgroup
// statistics. Everything is real — a containerd daemon, runc, CRIU; the
// package has no fake backend.
//
// # Daemon
//
// [StartContainerd] runs a private containerd as a supervised child (own
// root, state, sockets and config under one directory; restarted when it
// dies; stopped by [Containerd.Stop] or when this process dies). [Connect]
// binds a [Client] to any containerd — that one, or a system daemon — in one
// namespace ([DefaultNamespace]) with a private runc root and cgroup parent.
// The client is written against containerd's v2 Go client and is tested
// against the containerd 2.3 and runc deploy/setup.sh builds; [Connect]
// refuses a daemon older than [MinContainerd].
//
// # Sandboxes
//
// [Client.Start] creates a container from an imported image (see
// [Client.Import]) with an overlayfs snapshot, the [Spec]'s limits (CFS
// quota, memory limit), network (a private namespace, loopback down or up)
// and bind mounts, and starts its task with stdout and stderr appended to
// files. [Client.Load] reattaches to a sandbox a previous process left
// running. [Sandbox.Stats] reads its cgroup (v1 or v2); [Sandbox.Destroy]
// removes task, container and snapshot.
//
// # Checkpoint and restore
//
// [Sandbox.Checkpoint] freezes the task, has containerd's runc shim dump it
// with CRIU straight into a directory the caller names (the task
// checkpoint's image path: no tar, no content store), and writes the rw
// layer's diff against the image as a tar. [Client.Restore] makes a new
// snapshot over the same image, applies that tar, and creates the task from
// the image directory. Between the two the processes keep their pids,
// memory, open files and offsets, pipes and start time: the oracle unit in
// units/oracle checks all of it in this package's tests. [CheckpointStats]
// carries CRIU's own dump statistics (internal/criu's ReadDumpStats).
//
// What speaks CRIU is internal/criu's: the configuration the sandboxes'
// annotation names and their CRIU directories (criu.Dirs), the
// statistics, `criu check` and the process probe; and, under it,
// internal/criu/pageserver's lazy-pages and page server processes. The
// executor hands what they prepare to containerd and runc.
//
// # Caveats
//
//   - Checkpoint without [Checkpoint.Keep] ends the task; with Keep it stays
//     frozen until destroyed or resumed — the form a park that must not lose
//     a unit to a crash uses.
//   - Restore needs the same image, kernel, CPU features and CRIU as the
//     dump; the environment manifest ([Client.Versions]) is how callers
//     check that before they try.
//   - Output copying runs in this process (FIFOs): while no executor is
//     attached a unit that writes more than a pipe buffer blocks, until
//     [Client.Load] reattaches.
//   - The daemon must run as root on a kernel CRIU supports (criu.Check).
package executor
