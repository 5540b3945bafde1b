package protocol_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// mustBuild builds a unit as a static binary.
func mustBuild(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// process is a unit running as a plain process, standing in for a sandbox.
type process struct {
	cmd    *exec.Cmd
	out    bytes.Buffer
	exited chan error
}

func mustStart(t *testing.T, bin, dir string, env ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin), exited: make(chan error, 1)}
	p.cmd.Env = append(append(os.Environ(), "RUNRECORDD_DIR="+dir), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

// kill ends the process as the daemon destroys a sandbox.
func (p *process) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// TestAgentRestartsFromTranscript runs units/agent as a process against a
// daemon that parks it on every await — seals the transcript, kills the
// process, closes the socket — and, after posting the result, starts it
// again in a fresh directory holding only the restored transcript. In
// "crash", the process is also killed once between its dispatch of call-2
// and the transcript line recording it, and restarted in the same
// interval: the daemon refuses the second dispatch and the agent goes on.
func TestAgentRestartsFromTranscript(t *testing.T) {
	bin := mustBuild(t, "./units/agent")
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "parks", true: "crash"}[crash], func(t *testing.T) {
			testAgent(t, bin, crash)
		})
	}
}

func testAgent(t *testing.T, bin string, crash bool) {
	dir := t.TempDir()
	d := newDaemon(mustTranscript(t, dir))
	dispatching, proceed := make(chan string), make(chan struct{})
	if crash {
		d.onDispatch = func(id string) { dispatching <- id; <-proceed }
	}
	_, srv := mustServe(t, dir, d)
	env := []string{"STEPS=3", "WORK_ITERS=1000"}
	p := mustStart(t, bin, dir, env...)
	var out strings.Builder
	parks, crashed := 0, false
	timeout := time.After(60 * time.Second)
loop:
	for {
		select {
		case id := <-dispatching:
			if id == "call-2" && !crashed {
				p.kill()
				crashed = true
				proceed <- struct{}{}
				out.WriteString(p.out.String())
				p = mustStart(t, bin, dir, env...)
				continue
			}
			proceed <- struct{}{}
		case ids := <-d.parks:
			parks++
			p.kill()
			out.WriteString(p.out.String())
			sealed, err := os.ReadFile(d.transcript)
			if err != nil {
				t.Fatal(err)
			}
			srv.Close()
			for _, id := range ids {
				if err := d.post(id, fmt.Sprintf(`{"call":%q,"artifact":"sha256:%d"}`, id, parks)); err != nil {
					t.Fatal(err)
				}
			}
			dir = t.TempDir()
			path := filepath.Join(dir, protocol.TranscriptFile)
			if err := os.WriteFile(path, sealed, 0o644); err != nil {
				t.Fatal(err)
			}
			d.resume(path)
			_, srv = mustServe(t, dir, d)
			p = mustStart(t, bin, dir, env...)
		case err := <-p.exited:
			out.WriteString(p.out.String())
			if err != nil {
				t.Fatalf("agent: %v\n%s", err, out.String())
			}
			break loop
		case <-timeout:
			t.Fatalf("agent did not finish\n%s", out.String())
		}
	}
	t.Logf("agent output:\n%s", out.String())

	got, err := os.ReadFile(d.transcript)
	if err != nil {
		t.Fatal(err)
	}
	want := `step 1: thinking
step 1: dispatched call-1
step 1: result {"call":"call-1","artifact":"sha256:1"}
step 2: thinking
step 2: dispatched call-2
step 2: result {"call":"call-2","artifact":"sha256:2"}
step 3: thinking
step 3: dispatched call-3
step 3: result {"call":"call-3","artifact":"sha256:3"}
done
`
	if string(got) != want {
		t.Errorf("transcript:\n%s\nwant:\n%s", got, want)
	}
	if got := d.dispatches(); strings.Join(got, ",") != "call-1,call-2,call-3" {
		t.Errorf("dispatches %v, want exactly call-1..3", got)
	}
	if parks != 3 || d.interval != 4 {
		t.Errorf("%d parks, %d intervals; want 3, 4", parks, d.interval)
	}
	if crash != strings.Contains(out.String(), "already dispatched before a restart") {
		t.Errorf("crash %v, but the agent's output disagrees", crash)
	}
	accounts := fmt.Sprint(append(d.accounts, d.cur))
	if want := "[{[call-1] []} {[call-2] [call-1]} {[call-3] [call-2]} {[] [call-3]}]"; accounts != want {
		t.Errorf("accounts %s, want %s", accounts, want)
	}
	if v := d.proof(); v.Kind != record.NonBlocking {
		t.Errorf("wait proof %v, want NonBlocking", v)
	}
}

// TestPollerBlocks runs units/poller as a process: it dispatches call-1
// and polls for it inside its one interval, so its wait proof is Blocked
// at that interval.
func TestPollerBlocks(t *testing.T) {
	bin := mustBuild(t, "./units/poller")
	d, sock, _ := mustDaemon(t)
	p := mustStart(t, bin, filepath.Dir(sock), "POLL_MS=20")
	deadline := time.Now().Add(30 * time.Second)
	for len(d.dispatches()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("poller never dispatched\n%s", p.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // several polls find nothing
	if err := d.post("call-1", `{"artifact":"a1"}`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("poller: %v\n%s", err, p.out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("poller did not finish\n%s", p.out.String())
	}
	t.Logf("poller output:\n%s", p.out.String())
	if got, _ := os.ReadFile(d.transcript); string(got) != "dispatched call-1\nresult {\"artifact\":\"a1\"}\n" {
		t.Errorf("transcript %q", got)
	}
	if !strings.Contains(p.out.String(), `"action":"result"`) || strings.Contains(p.out.String(), `"polls":1,`) {
		t.Errorf("want a result after several polls:\n%s", p.out.String())
	}
	v := d.proof()
	if v.Kind != record.Blocked || v.Segment != 0 {
		t.Errorf("wait proof %v, want Blocked at segment 0", v)
	}
	if _, _, err := d.Result(context.Background(), "call-1"); err != nil {
		t.Errorf("delivered result: %v", err)
	}
	if err := d.post("call-1", `{}`); !errors.Is(err, protocol.ErrResolved) {
		t.Errorf("posting twice: %v", err)
	}
}
