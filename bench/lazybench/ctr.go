package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// ctrNS is the containerd namespace of the ctr mode, beside the executor's.
const ctrNS = "lazybench-ctr"

// ctrx runs ctr against the bench's containerd in ctrNS.
func (b *bench) ctrx(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", b.address, "--namespace", ctrNS}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %v: %w: %s", args, err, out)
	}
	return nil
}

// ctrRound is the ctr mode (bench/park.sh's ctr method, in this run):
// `ctr run` the unit, `ctr c checkpoint --task --rw` into the content
// store, remove the container, settle, and time `ctr c restore --live
// --rw`; the unit's next line, read from the restored task's stdout FIFO,
// must carry its old start time.
func (b *bench) ctrRound(ctx context.Context, r int) (err error) {
	id := fmt.Sprintf("lb-ctr-%d", r)
	ref := "lazybench.local/checkpoint:" + strconv.Itoa(r)
	log := filepath.Join(b.dir, id+".out")
	if !b.ctrImported {
		if err := b.ctrx(ctx, "images", "import", b.archive); err != nil {
			return err
		}
		b.ctrImported = true
	}
	defer func() {
		_ = b.ctrx(context.Background(), "tasks", "rm", "-f", id)
		_ = b.ctrx(context.Background(), "containers", "rm", id)
		_ = b.ctrx(context.Background(), "images", "rm", ref)
		fifos, _ := filepath.Glob("/run/containerd/fifo/*/" + id + "-stdout")
		for _, f := range fifos {
			os.RemoveAll(filepath.Dir(f))
		}
	}()
	if err := b.ctrx(ctx, "run", "-d", "--log-uri", "file://"+log, "--env", "SIZE_MB="+strconv.Itoa(b.sizeMB),
		"--env", "TICK_MS=250", imageName(b.unit), id); err != nil {
		return err
	}
	ready, err := nextLine(log, 0, 60*time.Second)
	if err != nil {
		return err
	}
	if err := b.ctrx(ctx, "containers", "checkpoint", "--task", "--rw", id, ref); err != nil {
		return err
	}
	if err := b.ctrx(ctx, "tasks", "rm", "-f", id); err != nil {
		return err
	}
	if err := b.ctrx(ctx, "containers", "rm", id); err != nil {
		return err
	}
	if err := settle(); err != nil {
		return err
	}
	t0 := time.Now()
	if err := b.ctrx(ctx, "containers", "restore", "--live", "--rw", id, ref); err != nil {
		return err
	}
	took := time.Since(t0)
	b.add("ctr restore", took)
	l, err := fifoLine(id)
	if err != nil {
		return err
	}
	if l.StartTime != ready.StartTime {
		return fmt.Errorf("ctr restore: the unit restarted (start time %d, was %d)", l.StartTime, ready.StartTime)
	}
	fmt.Printf("round %d ctr        restore %5s\n", r, ms(took))
	return nil
}

// fifoLine reads the next line of a ctr-restored task's stdout FIFO (ctr
// 1.6 puts them under /run/containerd/fifo).
func fifoLine(id string) (line, error) {
	fifos, _ := filepath.Glob("/run/containerd/fifo/*/" + id + "-stdout")
	if len(fifos) != 1 {
		return line{}, fmt.Errorf("ctr restore: %d stdout FIFOs for %s", len(fifos), id)
	}
	got := make(chan line, 1)
	errc := make(chan error, 1)
	go func() {
		f, err := os.Open(fifos[0])
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		if !sc.Scan() {
			errc <- fmt.Errorf("ctr restore: no line on %s", fifos[0])
			return
		}
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	select {
	case l := <-got:
		return l, nil
	case err := <-errc:
		return line{}, err
	case <-time.After(30 * time.Second):
		return line{}, fmt.Errorf("ctr restore: no line from %s in 30s", id)
	}
}
