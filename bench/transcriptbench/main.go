// Command transcriptbench measures transcript parks against plain
// containers, side by side in one run, on one embedded containerd:
//
//   - plain: create + start of a sandbox of the poller image (with a bind
//     mount like a transcript unit's channel), and its teardown;
//   - transcript: a poller run (transcript mode) started by the daemon,
//     parked (freeze, seal the transcript, evidence, two segments,
//     teardown), then resumed by posting the result it awaits (channel and
//     transcript restored, a fresh sandbox, one segment).
//
// Rounds alternate the two, so the machine's noise falls on both alike. It
// prints every round and the medians, and the two ratios issue 5 sets
// targets for: transcript park − plain teardown (≤ 20 ms), and park → resume
// round trip ÷ plain create + start (≤ 1.2).
//
// With -warm N it measures instead posted result → unit running from a
// warm sandbox against plain create + start (warm.go, bench/warm.sh).
//
// Usage (as root; bench/transcript.sh builds the image):
//
//	transcriptbench -image bin/units/poller.tar -n 15
//	transcriptbench -image bin/units/poller.tar -n 50 -warm 8
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/daemon"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/host"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

const imageName = "runrecordd.local/poller:1"

func main() {
	archive := flag.String("image", "bin/units/poller.tar", "the poller unit's OCI archive")
	n := flag.Int("n", 15, "rounds")
	gap := flag.Duration("gap", 300*time.Millisecond, "wait between park and post in the second transcript column (a result that arrives once the parked sandbox is gone)")
	warm := flag.Int("warm", 0, "measure resumes from a warm sandbox instead, the daemon's pool holding up to this many (warm.go)")
	flag.Parse()
	var err error
	if *warm > 0 {
		err = runWarm(*archive, *n, *warm)
	} else {
		err = run(*archive, *n, *gap)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "transcriptbench:", err)
		os.Exit(1)
	}
}

func run(archive string, n int, gap time.Duration) error {
	ctx := context.Background()
	d, pl, done, err := open(ctx, archive, "rrtb-", 0)
	if err != nil {
		return err
	}
	defer done()

	var s samples
	fmt.Printf("round  plain create+start  plain teardown  transcript park  resume (post→running)  round trip  | after a %s gap: park  resume  round trip\n", gap)
	for i := range n {
		if err := s.round(ctx, d, pl, i, gap); err != nil {
			return err
		}
	}
	s.report(gap)
	return nil
}

// plain starts plain containers of the poller image: a second client of
// the daemon's containerd, in its own namespace, and a channel served by
// a handler that never delivers.
type plain struct {
	ex   *executor.Client
	srv  *protocol.Server
	spec executor.Spec
	out  executor.Output
}

// pollerImage is the poller unit's OCI archive and its image's digest.
type pollerImage struct {
	archive, digest string
}

// newPlain connects the plain client, imports the image into its
// namespace and serves the channel its containers mount under dir.
func newPlain(ctx context.Context, d *daemon.Daemon, dir string, img pollerImage, log *slog.Logger) (*plain, error) {
	// A second client of the same containerd, in its own namespace, for
	// the plain containers.
	ex, err := executor.Connect(ctx, executor.Config{Address: d.Host().Containerd, Namespace: "bench-plain",
		StateDir: filepath.Join(dir, "plain"), CgroupParent: "/runrecordd-bench-plain", Logger: log})
	if err != nil {
		return nil, err
	}
	if _, err := ex.ImportFile(ctx, img.archive, imageName); err != nil {
		ex.Close()
		return nil, err
	}
	// The plain container gets a channel too, served by a handler that
	// never delivers, so that it runs (polling) like the transcript unit
	// and both teardowns kill a live process.
	mnt := filepath.Join(dir, "mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		ex.Close()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(mnt, protocol.TranscriptFile), nil, 0o600); err != nil {
		ex.Close()
		return nil, err
	}
	ln, err := net.Listen("unix", filepath.Join(mnt, protocol.SocketFile))
	if err != nil {
		ex.Close()
		return nil, err
	}
	srv := protocol.NewServer(idleHandler{})
	go srv.Serve(ln)
	spec := executor.SpecOf(unit.Spec{Image: imageName, ImageDigest: img.digest}, unit.Grants{Network: unit.NoNetwork})
	spec.Mounts = []executor.Mount{{Source: mnt, Target: protocol.Dir, Writable: true}}
	// Its output goes to files, as a unit's does.
	out := executor.Output{Stdout: filepath.Join(dir, "plain.out"), Stderr: filepath.Join(dir, "plain.err")}
	return &plain{ex: ex, srv: srv, spec: spec, out: out}, nil
}

// close stops the channel's server, then the client.
func (p *plain) close() {
	p.srv.Close()
	p.ex.Close()
}

// round starts plain container i and, once it has polled for a while,
// destroys it; it returns the create + start and the teardown times.
func (p *plain) round(ctx context.Context, i int) (create, teardown time.Duration, err error) {
	t0 := time.Now()
	sb, err := p.ex.Start(ctx, fmt.Sprintf("plain-%d", i), p.spec, p.out)
	if err != nil {
		return 0, 0, err
	}
	create = time.Since(t0)
	time.Sleep(200 * time.Millisecond) // let it dispatch and poll, as the transcript unit does
	t1 := time.Now()
	if err := sb.Destroy(ctx); err != nil {
		return 0, 0, err
	}
	return create, time.Since(t1), nil
}

// samples are the rounds' times, and the park's and resume's steps by
// name in the order first seen.
type samples struct {
	create, teardown, park, resume, trip, parkGap, resumeGap, tripGap []time.Duration

	steps map[string][]time.Duration
	order []string
}

// round runs round i — plain, then transcript with the post at once, then
// after gap — and prints its times.
func (s *samples) round(ctx context.Context, d *daemon.Daemon, pl *plain, i int, gap time.Duration) error {
	c, td, err := pl.round(ctx, i)
	if err != nil {
		return err
	}
	// Transcript: start, let it dispatch, park, post its result —
	// at once, and after a gap.
	p, pr, rs, err := transcriptRound(ctx, d, fmt.Sprintf("tb-%d", i), 0)
	if err != nil {
		return err
	}
	pg, _, rsg, err := transcriptRound(ctx, d, fmt.Sprintf("tbg-%d", i), gap)
	if err != nil {
		return err
	}
	pkg := pg.Took
	s.parkGap, s.resumeGap, s.tripGap = append(s.parkGap, pkg), append(s.resumeGap, rsg), append(s.tripGap, pkg+rsg)
	pk := p.Took
	if s.steps == nil {
		s.steps = map[string][]time.Duration{}
	}
	for _, st := range append(p.Steps, prefixed("resume.", pr.Resumed.Steps)...) {
		if _, ok := s.steps[st.Name]; !ok {
			s.order = append(s.order, st.Name)
		}
		s.steps[st.Name] = append(s.steps[st.Name], st.Took)
	}
	s.create, s.teardown, s.park, s.resume, s.trip = append(s.create, c), append(s.teardown, td), append(s.park, pk), append(s.resume, rs), append(s.trip, pk+rs)
	fmt.Printf("%5d  %17s  %14s  %15s  %21s  %10s  | %s  %s  %s\n", i+1, ms(c), ms(td), ms(pk), ms(rs), ms(pk+rs), ms(pkg), ms(rsg), ms(pkg+rsg))
	return nil
}

// report prints the medians, the steps' medians and the ratios issue 5
// sets targets for.
func (s *samples) report(gap time.Duration) {
	mc, mt, mp, mr, mtrip := median(s.create), median(s.teardown), median(s.park), median(s.resume), median(s.trip)
	fmt.Printf("median %17s  %14s  %15s  %21s  %10s  | %s  %s  %s\n", ms(mc), ms(mt), ms(mp), ms(mr), ms(mtrip),
		ms(median(s.parkGap)), ms(median(s.resumeGap)), ms(median(s.tripGap)))
	fmt.Print("\npark and resume steps (medians):")
	for _, name := range s.order {
		fmt.Printf(" %s %s;", name, ms(median(s.steps[name])))
	}
	fmt.Println()
	fmt.Printf("\ntranscript park − plain teardown: %s (target ≤ 20 ms)\n", ms(mp-mt))
	fmt.Printf("round trip ÷ plain create+start:  %.2f (target ≤ 1.2)\n", float64(mtrip)/float64(mc))
	fmt.Printf("resume ÷ plain create+start:      %.2f\n", float64(mr)/float64(mc))
	fmt.Printf("round trip ÷ plain create+start+teardown: %.2f\n", float64(mtrip)/float64(mc+mt))
	fmt.Printf("after a %s gap: round trip ÷ plain create+start: %.2f (target ≤ 1.2); resume ÷ plain create+start: %.2f\n",
		gap, float64(median(s.tripGap))/float64(mc), float64(median(s.resumeGap))/float64(mc))
}

// transcriptRound starts a poller run, parks it once it has dispatched, and
// after gap posts the result it awaits, which resumes it; it returns the
// park, the post's result and the post's duration, once the run is over.
func transcriptRound(ctx context.Context, d *daemon.Daemon, id string, gap time.Duration) (answers.Parked, answers.Posted, time.Duration, error) {
	if _, err := d.Start(ctx, id, unit.Spec{Image: imageName, Mode: unit.TranscriptMode}, unit.Grants{}); err != nil {
		return answers.Parked{}, answers.Posted{}, 0, err
	}
	if err := waitCall(ctx, d, id); err != nil {
		return answers.Parked{}, answers.Posted{}, 0, err
	}
	p, err := d.Park(ctx, id)
	if err != nil {
		return answers.Parked{}, answers.Posted{}, 0, err
	}
	time.Sleep(gap)
	t := time.Now()
	pr, err := d.PostResult(ctx, id, "call-1", []byte(`"done"`))
	if err != nil {
		return answers.Parked{}, answers.Posted{}, 0, err
	}
	rs := time.Since(t)
	if pr.Resumed == nil {
		return answers.Parked{}, answers.Posted{}, 0, fmt.Errorf("run %s did not resume: %+v", id, pr)
	}
	// The poller exits once it has its result, which closes the run.
	return p, pr, rs, waitClosed(ctx, d, id)
}

func waitCall(ctx context.Context, d *daemon.Daemon, id string) error {
	for range 500 {
		cs, err := calls.List(d.Rooms().Store)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if c.Run == id {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("run %s dispatched nothing", id)
}

func waitClosed(ctx context.Context, d *daemon.Daemon, id string) error {
	for range 500 {
		r, err := d.Run(id)
		if err != nil {
			return err
		}
		if r.Phase == record.PhaseClosed {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("run %s did not finish", id)
}

func prefixed(p string, steps []answers.Step) []answers.Step {
	out := make([]answers.Step, len(steps))
	for i, s := range steps {
		out[i] = answers.Step{Name: p + s.Name, Took: s.Took}
	}
	return out
}

// idleHandler answers a unit's channel and never delivers a result.
type idleHandler struct{}

func (idleHandler) Hello(context.Context) (protocol.Hello, error) {
	return protocol.Hello{Protocol: protocol.Version, Run: "plain", Interval: 1}, nil
}
func (idleHandler) Append(_ context.Context, b []byte) (int64, error)  { return int64(len(b)), nil }
func (idleHandler) Dispatch(context.Context, protocol.Call) error      { return nil }
func (idleHandler) Await(context.Context, []string) (bool, error)      { return false, nil }
func (idleHandler) Results(context.Context) ([]protocol.Result, error) { return nil, nil }
func (idleHandler) Result(context.Context, string) (protocol.Result, bool, error) {
	return protocol.Result{}, false, nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

// open starts a daemon on its embedded containerd in a new temporary
// directory (named prefix…), its warm pool holding up to pool sandboxes,
// imports the unit's archive into it, and readies the plain containers
// beside it; done stops and removes it all.
func open(ctx context.Context, archive, prefix string, pool int) (_ *daemon.Daemon, _ *plain, done func(), err error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, nil, nil, err
	}
	var undo []func()
	done = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			done()
		}
	}()
	undo = append(undo, func() { os.RemoveAll(dir) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := daemon.New(ctx, daemon.Config{Config: host.Config{StateDir: filepath.Join(dir, "s"), Logger: log, WarmPool: pool}})
	if err != nil {
		return nil, nil, nil, err
	}
	undo = append(undo, func() { d.Shutdown(context.Background()) })
	f, err := os.Open(archive)
	if err != nil {
		return nil, nil, nil, err
	}
	img, err := d.ImportImage(ctx, f, imageName)
	f.Close()
	if err != nil {
		return nil, nil, nil, err
	}
	pl, err := newPlain(ctx, d, dir, pollerImage{archive: archive, digest: img.Digest}, log)
	if err != nil {
		return nil, nil, nil, err
	}
	undo = append(undo, pl.close)
	return d, pl, done, nil
}
