//go:build linux

package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// egressBenchRounds runs TestEgressBench (docs/benchmarks.md, "Egress");
// 0, the default, leaves it out of `make test`.
var egressBenchRounds = flag.Int("egressbench", 0, "run TestEgressBench with this many rounds")

// egressBenchMiB is what each transfer of TestEgressBench carries.
var egressBenchMiB = flag.Int("egressbench-mib", 256, "MiB of each of TestEgressBench's transfers")

// The plain link of TestEgressBench: a veth between the world and a
// namespace of its own, no rule on either side.
const (
	plainNetns     = "rrtest-plain"
	plainWorldAddr = "198.51.100.1"
	plainPeerAddr  = "198.51.100.2"
	benchPort      = "8084"
)

// TestEgressBench measures, when asked (go test -run EgressBench
// ./test/e2e/ -args -egressbench 15): the hostile unit idle, granted
// egress and granted loopback alternately, each round started, parked and
// resumed, timed at the client (the added cost of the link, and the link
// step alone from the daemon's debug log); then the world's stream of
// -egressbench-mib MiB to a sandbox through the host's translation,
// alternating with the same to a namespace over a plain veth, timed in
// the world from the accept to the reader's close.
func TestEgressBench(t *testing.T) {
	if *egressBenchRounds == 0 {
		t.Skip("a measure, run with -args -egressbench 15")
	}
	privileged(t)
	ctx := context.Background()
	w := newEgressWorld(t) // holds the machine's egress lock
	t.Cleanup(func() { removeEgressHost(t) })
	d := mustDaemon(t, "egressbench", func(d *daemon) {
		d.flags = []string{"--egress-allow", egressWorld + "/32"}
	})
	mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	logStart := logSize(t, d)

	// Setup: start, park, resume to running.
	type op struct{ start, park, resume []time.Duration }
	ops := map[string]*op{"egress": {}, "loopback": {}}
	for r := range *egressBenchRounds {
		order := []string{"egress", "loopback"}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, m := range order {
			id := fmt.Sprintf("eb-%s-%d", m, r)
			g := unit.Grants{MilliCPU: 1000, MemoryBytes: 128 << 20, Network: unit.Loopback}
			if m == "egress" {
				g = egressGrants(t, egressWorld+"/32:"+benchPort)
			}
			t0 := time.Now()
			_, err := d.c.Start(ctx, api.RunRequest{ID: id,
				Unit: unit.Spec{Image: hostileImage, Env: []string{"HOSTILE=idle"}}, Grants: g})
			if err != nil {
				t.Fatalf("start %s: %v", id, err)
			}
			t1 := time.Now()
			if _, err := d.c.Park(ctx, id); err != nil {
				t.Fatalf("park %s: %v", id, err)
			}
			t2 := time.Now()
			if _, err := d.c.Resume(ctx, id); err != nil {
				t.Fatalf("resume %s: %v", id, err)
			}
			t3 := time.Now()
			if _, err := d.c.Close(ctx, id, "benchmark"); err != nil {
				t.Fatalf("close %s: %v", id, err)
			}
			o := ops[m]
			o.start, o.park, o.resume = append(o.start, t1.Sub(t0)), append(o.park, t2.Sub(t1)), append(o.resume, t3.Sub(t2))
		}
	}
	e, l := ops["egress"], ops["loopback"]
	for _, s := range []struct {
		name string
		e, l []time.Duration
	}{{"start to running", e.start, l.start}, {"park", e.park, l.park}, {"resume to running", e.resume, l.resume}} {
		me, ml := medianDur(s.e), medianDur(s.l)
		t.Logf("%-18s egress %8.1f ms  loopback %8.1f ms  added %+7.1f ms (medians of %d)", s.name, ms(me), ms(ml), ms(me-ml), len(s.e))
	}
	links := linkTimes(t, d, logStart)
	t.Logf("the link step alone (debug log %q): median %.1f ms of %d (%.1f–%.1f)", "linked out", ms(medianDur(links)), len(links), ms(slices.Min(links)), ms(slices.Max(links)))

	// Throughput.
	plain := plainWorld(t)
	size := int64(*egressBenchMiB) << 20
	took := benchServer(t, w, size)
	tput := map[string][]float64{}
	for r := range *egressBenchRounds {
		order := []string{"translated", "plain"}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, m := range order {
			if m == "plain" {
				inNetns(t, plain, func() { drain(t, plainWorldAddr+":"+benchPort, size) })
			} else {
				id := fmt.Sprintf("eb-drain-%d", r)
				g := egressGrants(t, egressWorld+"/32:"+benchPort)
				g.MilliCPU = 2000 // the plain reader is not held to a core either
				startHostile(t, d, id, "egress-drain", []string{"HOSTILE_ADDR=" + egressWorld + ":" + benchPort}, g)
				if s := waitSaid(t, d, id, "egress-drain", "drained "); s != fmt.Sprintf("drained %d <nil>", size) {
					t.Fatalf("%s: %q", id, s)
				}
			}
			dt := <-took
			tput[m] = append(tput[m], float64(size)/1e6/dt.Seconds())
		}
	}
	mt, mp := medianF(tput["translated"]), medianF(tput["plain"])
	t.Logf("%d MiB from the world: translated %.0f MB/s, plain veth %.0f MB/s, ratio %.2f (medians of %d; %v, %v)",
		*egressBenchMiB, mt, mp, mt/mp, len(tput["plain"]), tput["translated"], tput["plain"])
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		t.Logf("load average at the end: %s", strings.TrimSpace(string(b)))
	}
}

// plainWorld links the world to a namespace of the benchmark's own over a
// veth, with no rule, and returns that namespace.
func plainWorld(t *testing.T) netns.NsHandle {
	t.Helper()
	_ = exec.Command("ip", "netns", "del", plainNetns).Run()
	egressCmd(t, "ip", "netns", "add", plainNetns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", plainNetns).Run() })
	egressCmd(t, "ip", "-n", egressNetns, "link", "add", "rrtp0", "type", "veth", "peer", "name", "eth0", "netns", plainNetns)
	egressCmd(t, "ip", "-n", egressNetns, "addr", "add", plainWorldAddr+"/30", "dev", "rrtp0")
	egressCmd(t, "ip", "-n", egressNetns, "link", "set", "rrtp0", "up")
	egressCmd(t, "ip", "-n", plainNetns, "addr", "add", plainPeerAddr+"/30", "dev", "eth0")
	egressCmd(t, "ip", "-n", plainNetns, "link", "set", "eth0", "up")
	egressCmd(t, "ip", "-n", plainNetns, "link", "set", "lo", "up")
	ns, err := netns.GetFromName(plainNetns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	time.Sleep(100 * time.Millisecond) // both ends' carrier
	return ns
}

// benchServer listens in the world on benchPort: each connection is sent
// size bytes, its write side closed, and the time from the accept to the
// reader's close is sent on the channel it returns.
func benchServer(t *testing.T, w *egressWorldNS, size int64) <-chan time.Duration {
	t.Helper()
	var l net.Listener
	inNetns(t, w.ns, func() {
		var err error
		if l, err = net.Listen("tcp4", "0.0.0.0:"+benchPort); err != nil {
			t.Error(err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() { l.Close() })
	took := make(chan time.Duration, 1)
	go func() {
		buf := make([]byte, 256<<10)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t0 := time.Now()
			for left := size; left > 0; {
				n, err := c.Write(buf[:min(left, int64(len(buf)))])
				if err != nil {
					t.Errorf("the world's stream: %v", err)
					break
				}
				left -= int64(n)
			}
			_ = c.(*net.TCPConn).CloseWrite()
			_, _ = io.Copy(io.Discard, c) // to the reader's close
			took <- time.Since(t0)
			c.Close()
		}
	}()
	return took
}

// drain reads addr's stream of size bytes to its end, then closes.
func drain(t *testing.T, addr string, size int64) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, c)
	c.Close()
	if err != nil || n != size {
		t.Fatalf("the plain stream: %d bytes, %v", n, err)
	}
}

// logSize is the length of d's log now.
func logSize(t *testing.T, d *daemon) int {
	b, err := os.ReadFile(d.log)
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

// linkTimes are the took= of the egress runs' "linked out" lines in d's
// log after offset from.
func linkTimes(t *testing.T, d *daemon, from int) []time.Duration {
	b, err := os.ReadFile(d.log)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Duration
	for _, l := range strings.Split(string(b[from:]), "\n") {
		if !strings.Contains(l, "linked out") || !strings.Contains(l, "id=eb-egress-") {
			continue
		}
		_, v, ok := strings.Cut(l, " took=")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, " ")
		if dur, err := time.ParseDuration(v); err == nil {
			out = append(out, dur)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %q line with took= in %s", "linked out", d.log)
	}
	return out
}

func medianDur(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianF(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
