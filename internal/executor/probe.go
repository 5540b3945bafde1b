//go:build linux

package executor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
)

// Probe dumps and restores a throwaway process with the criu binary, then
// a throwaway container through containerd (runc and CRIU, as a park and a
// resume do), each step under deadline. Everything it makes is removed.
func (c *Client) Probe(ctx context.Context, deadline time.Duration) criu.Probe {
	start := time.Now()
	var p criu.Probe
	logs, err := c.probeProcess(ctx, deadline)
	if err == nil {
		var clogs []byte
		clogs, err = c.probeContainer(ctx, deadline, nil)
		logs = append(logs, clogs...)
	}
	if err == nil && c.cfg.ProbeUserNS != nil {
		// Its logs are not searched for the build's capabilities:
		// those of the plain container say it.
		_, uerr := c.probeContainer(ctx, deadline, c.cfg.ProbeUserNS)
		p.UserNSTried, p.UserNS = true, uerr == nil
		if uerr != nil {
			p.UserNSReason = uerr.Error()
		}
	}
	p.ReadLogs(logs)
	p.OK = err == nil
	if err != nil {
		p.Reason = err.Error()
	}
	p.Took = time.Since(start)
	return p
}

// probeDir makes a fresh directory for one probe under the executor's
// state.
func (c *Client) probeDir() (string, string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := "probe-" + hex.EncodeToString(b[:])
	dir := filepath.Join(c.cfg.StateDir, "probe", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	return id, dir, nil
}

// probeProcess dumps a sleeping process of its own with criu and restores
// it (criu.ProbeProcess), in a probe directory it removes; it returns
// CRIU's logs.
func (c *Client) probeProcess(ctx context.Context, deadline time.Duration) ([]byte, error) {
	_, dir, err := c.probeDir()
	if err != nil {
		return nil, err
	}
	defer removeTree(dir)
	logs, err := criu.ProbeProcess(ctx, c.cfg.CRIU, dir, deadline)
	if _, ok := errors.AsType[*exec.Error](err); ok { // no criu to run
		err = fmt.Errorf("%w: %w", ErrMissing, err)
	}
	return logs, err
}
