package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// daemon is the benchmark's runrecordd: `serve` on a state directory of
// its own, in its own session, its log appended to log.
type daemon struct {
	bin, state, log string
	flags           []string
	cmd             *exec.Cmd
	done            chan error
	c               *api.Client
}

// socket is the daemon's API socket.
func (d *daemon) socket() string { return filepath.Join(d.state, "runrecordd.sock") }

// start starts the daemon and waits until it answers and its image parks
// are available (the probe passed).
func (d *daemon) start(ctx context.Context) error {
	if err := os.MkdirAll(d.state, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append([]string{"serve", "--state-dir", d.state, "--socket", d.socket(), "--warm-pool", "0"}, d.flags...)
	cmd := exec.Command(d.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	d.cmd, d.done = cmd, make(chan error, 1)
	go func() { d.done <- cmd.Wait() }()
	d.c = api.NewClient(d.socket())
	deadline := time.Now().Add(3 * time.Minute)
	for {
		cx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h, err := d.c.Host(cx)
		cancel()
		switch {
		case err == nil && h.ImageParks.Status == "available":
			return nil
		case err == nil && h.ImageParks.Status == "unavailable":
			return fmt.Errorf("the daemon's image parks are unavailable: %s", h.ImageParks.Reason)
		}
		select {
		case err := <-d.done:
			d.done <- err
			return fmt.Errorf("the daemon exited at start (%v); see %s", err, d.log)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon did not answer with image parks available; see %s", d.log)
		}
	}
}

// kill kills the daemon with SIGKILL and waits for it to go: what it
// started (containerd, shims, lazy-pages) goes on.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.done
	d.done <- errors.New("killed")
}

// stop stops the daemon with SIGTERM and waits for it, a minute at most.
func (d *daemon) stop() error {
	if d.cmd == nil {
		return nil
	}
	select {
	case err := <-d.done:
		d.done <- err
		return nil
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		d.done <- err
		if err != nil {
			return fmt.Errorf("the daemon's stop: %w; see %s", err, d.log)
		}
		return nil
	case <-time.After(time.Minute):
		d.kill()
		return fmt.Errorf("the daemon did not stop within a minute; killed")
	}
}
