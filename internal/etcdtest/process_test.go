package etcdtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSpawned runs a cluster whose members are processes of the member
// program: it writes through all three, stops one (its process exits),
// writes through two, restarts it and reads the write back from it, finds
// exactly one leader, and checks that Close leaves no member process and
// no port answering.
func TestSpawned(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "etcdmember")
	if err := Build(context.Background(), bin); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Spawn(bin, t.TempDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	pids := make([]int, Members)
	for i, m := range c.members {
		p, ok := m.run.(*process)
		if !ok {
			t.Fatalf("member %d runs as %T, want a process", i, m.run)
		}
		pids[i] = p.cmd.Process.Pid
	}
	cli := c.Client(t)
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatalf("put with three members: %v", err)
	}

	c.Stop(2)
	if c.Running(2) || alive(pids[2]) {
		t.Fatalf("member 2 running (%v) or its process %d alive after Stop", c.Running(2), pids[2])
	}
	if _, err := cli.Put(ctx, "k", "v2"); err != nil {
		t.Fatalf("put with two of three members: %v", err)
	}
	c.Restart(t, 2)
	r, err := NewClient(t, c.Endpoint(2)).Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatalf("the restarted member reads %v, %v; want v2", r, err)
	}
	pids[2] = c.members[2].run.(*process).cmd.Process.Pid

	// Asked one after the other, the members may straddle a change of
	// leader: asked again, for up to 10 s.
	leaders := 0
	for deadline := time.Now().Add(10 * time.Second); ; {
		leaders = 0
		for _, m := range c.members {
			if m.run.leads() {
				leaders++
			}
		}
		if leaders == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if leaders != 1 {
		t.Errorf("%d members say they lead, want 1", leaders)
	}

	c.Close()
	for i, m := range c.members {
		if alive(pids[i]) {
			t.Errorf("member %d's process %d alive after Close", i, pids[i])
		}
		for _, host := range []string{m.client.Host, m.peerURL.Host} {
			if conn, err := net.DialTimeout("tcp", host, time.Second); err == nil {
				_ = conn.Close()
				t.Errorf("member %d: %s still accepts connections after Close", i, host)
			}
		}
	}
}

// alive reports whether process pid exists (a zombie counts as gone: it
// serves nothing).
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(s[i+1:], " Z")
}

// TestServeRefuses checks that the member program refuses a flag it does
// not know and a URL without a host, starting nothing.
func TestServeRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"-nonsense"},
		{"-name", "m0", "-dir", dir, "-peer", "not a url", "-client", "http://127.0.0.1:1"},
	} {
		var out bytes.Buffer
		if err := Serve(args, strings.NewReader(""), &out); err == nil || out.Len() != 0 {
			t.Errorf("Serve %q: %v, printed %q; want an error and nothing printed", args, err, out.String())
		}
	}
}

// BenchmarkPutBesideBusyProcess writes through a cluster while three
// goroutines of the benchmark's own process allocate and hash 1 MiB
// buffers without pause, as a -race end-to-end test process does beside
// its daemons: members embedded in that process, then members in
// processes of their own. It reports each put's median and 99th
// percentile. Run it with -race to see what the e2e tests saw:
//
//	go test -race -run '^$' -bench PutBesideBusyProcess -benchtime 400x ./internal/etcdtest/
func BenchmarkPutBesideBusyProcess(b *testing.B) {
	ctx := context.Background()
	bin := filepath.Join(b.TempDir(), "etcdmember")
	if err := Build(ctx, bin); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []struct{ name, binary string }{{"embedded", ""}, {"spawned", bin}} {
		b.Run(mode.name, func(b *testing.B) {
			c, err := Spawn(mode.binary, b.TempDir)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			cli := c.Client(b)
			busy(b, 3)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				s := time.Now()
				if _, err := cli.Put(ctx, "k", "v"); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(s))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
		})
	}
}

// busy keeps n goroutines allocating and hashing 1 MiB buffers until b
// ends. Each keeps up to 200 of them (a slice of one keeps its whole
// array), so the process's heap holds up to 600 MiB and its collector has
// work to do, as a test process holding archives and images does.
func busy(b *testing.B, n int) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			var keep [][]byte
			for {
				select {
				case <-stop:
					return
				default:
				}
				buf := make([]byte, 1<<20)
				sum := sha256.Sum256(buf)
				keep = append(keep, buf[:sum[0]%2])
				if len(keep) > 200 {
					keep = keep[:0]
				}
			}
		})
	}
	b.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
}
