package store

import (
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

const crashChildEnv = "RUNRECORDD_STORE_CRASH_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		seed, _ := strconv.ParseInt(os.Getenv(crashChildEnv+"_SEED"), 10, 64)
		crashChild(dir, seed)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashChild appends to many runs and writes objects until it is killed.
// It follows the daemon's order: objects first (durable), then the segment.
func crashChild(dir string, seed int64) {
	s, err := Open(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	rng := rand.New(rand.NewSource(seed))
	for i := 0; ; i++ {
		run := fmt.Sprintf("run-%02d", rng.Intn(16))
		st, err := s.Head(run)
		if err != nil {
			if _, err := s.Create(run, record.Sum([]byte(run)), record.Sum([]byte("grants"))); err != nil {
				fmt.Fprintln(os.Stderr, "child create:", err)
				os.Exit(3)
			}
			continue
		}
		must := func(a record.Address, err error) record.Address {
			if err != nil {
				fmt.Fprintln(os.Stderr, "child:", err)
				os.Exit(3)
			}
			return a
		}
		tag := fmt.Sprintf("%d-%d-%d", seed, i, rng.Int())
		var seg record.Segment
		switch st.Phase {
		case record.Ended:
			continue
		case record.Active:
			if rng.Intn(3) > 0 {
				receipt := must(s.PutBytes([]byte("receipt " + tag)))
				journal := must(s.PutBytes([]byte("journal " + tag)))
				seg = record.Execution(must(s.PutBytes([]byte("attestation "+tag), receipt, journal)), &record.CallAccount{})
			} else {
				stage, err := s.StagingDir("criu")
				if err != nil {
					os.Exit(3)
				}
				for f := 0; f < 1+rng.Intn(4); f++ {
					os.WriteFile(filepath.Join(stage, fmt.Sprintf("pages-%d.img", f)), []byte(fmt.Sprintf("%s page %d %0*d", tag, f, rng.Intn(20000), 0)), 0o600)
				}
				dir, _, err := s.Ingest(stage)
				must(dir, err)
				seg = record.Suspension(record.ImageSnapshot(dir, nil), must(s.PutBytes([]byte("manifest "+tag))))
			}
		case record.Parked:
			r, err := s.Load(run)
			must(record.Address{}, err)
			snap := r.Segments[len(r.Segments)-1].Snapshot
			if rng.Intn(10) == 0 {
				seg = record.Closure("done")
			} else {
				seg = record.Resumption(snap, uint64(rng.Intn(1000)+1), record.Estimated)
			}
		}
		if _, err := s.Append(run, st.Head, seg); err != nil {
			fmt.Fprintln(os.Stderr, "child append:", err)
			os.Exit(3)
		}
	}
}

func TestCrashSIGKILL(t *testing.T) {
	kills := 200
	if testing.Short() {
		kills = 20
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewSource(20261202))
	maxSegs := 0
	for k := 0; k < kills; k++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashChildEnv+"_SEED="+strconv.Itoa(k))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(5+rng.Intn(60)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("kill %d: child ended on its own: %v", k, err)
		}
		s, err := Open(dir)
		if err != nil {
			t.Fatalf("after kill %d: open: %v", k, err)
		}
		cs, err := s.Check()
		s.Close()
		if err != nil {
			t.Fatalf("after kill %d: %v", k, err)
		}
		maxSegs = cs.Segments
	}
	if maxSegs < kills {
		t.Fatalf("only %d segments written over %d kills: the kills came before any work", maxSegs, kills)
	}
	t.Logf("crash test: survived %d SIGKILLs; store holds %d segments, every record verifies from genesis and every referenced object matches its address", kills, maxSegs)
	fmt.Printf("crash test: survived %d kills (%d segments)\n", kills, maxSegs)
}
