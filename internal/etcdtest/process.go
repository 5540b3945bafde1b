package etcdtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Package is the member program's import path, for go build ([Build]).
const Package = "github.com/runrecordd/runrecordd/internal/etcdtest/etcdmember"

// ready is the line the member program prints once its member serves.
const ready = "ready"

// stopTimeout bounds how long a member process may take to stop once its
// standard input is closed; it is killed after that.
const stopTimeout = 30 * time.Second

// Build builds the member program into out, with the go command of PATH
// run in the current directory (any directory of this module).
func Build(ctx context.Context, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, Package)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", Package, err, b)
	}
	return nil
}

// Serve is the member program: it runs the one member args describe (the
// flags spawn passes), prints "ready" on stdout once the member serves,
// and stops it when stdin ends — closed by [Cluster.Stop], or by the
// kernel when the process that started it exits, however it exits, so a
// member never outlives its test.
func Serve(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("etcdmember", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the error is returned, and printed by the program
	var m member
	var token, peer, client string
	fs.StringVar(&m.name, "name", "", "the member's name")
	fs.StringVar(&m.dir, "dir", "", "the member's data directory")
	fs.StringVar(&peer, "peer", "", "the member's peer URL")
	fs.StringVar(&client, "client", "", "the member's client URL")
	fs.StringVar(&m.initial, "initial-cluster", "", "every member's name=peer URL, comma-separated")
	fs.StringVar(&token, "token", "", "the cluster's token")
	fs.StringVar(&m.tls, "tls-dir", "", "serve clients over TLS with the Secure files of this directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, u := range []struct {
		text string
		into *url.URL
	}{{peer, &m.peerURL}, {client, &m.client}} {
		p, err := url.Parse(u.text)
		if err == nil && p.Host == "" {
			err = errors.New("no host")
		}
		if err != nil {
			return fmt.Errorf("URL %q: %w", u.text, err)
		}
		*u.into = *p
	}
	e, err := serve(&m, token)
	if err != nil {
		return err
	}
	defer e.Close()
	if _, err := fmt.Fprintln(stdout, ready); err != nil {
		return err
	}
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case <-eof:
		return nil
	case err := <-e.Err():
		return err
	}
}

// process is a member running as a process of the member program.
type process struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	client string
	tls    string        // a Secure's directory, when the member serves clients over TLS
	stderr bytes.Buffer  // read once exited is closed: Wait has copied it all
	exited chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's, once exited is closed
}

// spawn starts m as a process of binary, in cluster token, and waits until
// it serves.
func spawn(binary string, m *member, token string) (*process, error) {
	cmd := exec.Command(binary, "-name", m.name, "-dir", m.dir,
		"-peer", m.peerURL.String(), "-client", m.client.String(),
		"-initial-cluster", m.initial, "-token", token, "-tls-dir", m.tls)
	p := &process{cmd: cmd, client: m.client.String(), tls: m.tls, exited: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p.stdin = stdin
	first := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		first <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, r)
		p.err = cmd.Wait() // after every read of stdout, as Wait wants
		close(p.exited)
	}()
	select {
	case line := <-first:
		if line == ready {
			return p, nil
		}
		p.close() // exiting already, unless binary is not the member program
		return nil, fmt.Errorf("%s: %v: %s", binary, p.err, p.stderr.String())
	case <-time.After(startTimeout):
		p.close()
		return nil, fmt.Errorf("%s: not ready after %s: %s", binary, startTimeout, p.stderr.String())
	}
}

// leads asks the member itself.
func (p *process) leads() bool {
	cfg := clientv3.Config{Endpoints: []string{p.client}, DialTimeout: time.Second, Logger: zap.NewNop()}
	if p.tls != "" {
		var err error
		if cfg, err = (&Secure{Dir: p.tls}).ClientConfig(cfg.Endpoints, "", ""); err != nil {
			return false
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return false
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := cli.Status(ctx, p.client)
	return err == nil && s.Leader != 0 && s.Leader == s.Header.MemberId
}

// close ends the member's stdin, so it stops as etcd stops a member
// (handing its leadership on), and kills it if it has not exited after
// stopTimeout.
func (p *process) close() {
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}
