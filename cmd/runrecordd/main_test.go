package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/ociarchive"
	"github.com/runrecordd/runrecordd/pkg/api"
)

func TestMain(m *testing.M) {
	pageserver.MaybeRun() // a served lazy resume's page server: this binary again
	testscript.Main(m, map[string]func(){
		"runrecordd": func() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

// The daemon scripts (those under [daemon]) start real daemons: embedded
// containerd, runc sandboxes, CRIU parks, as root. They do not skip on a
// host that lacks any of it: TestScripts fails, saying what is missing,
// because CI runs as root with all of it installed. skipEnv=1 skips them,
// saying so, for a developer machine without root; the scripts that need
// no daemon (conformance, verify --file, usage errors) still run.
const skipEnv = "RUNRECORDD_SKIP_PRIVILEGED"

// oracleName is the name the scripts import the oracle unit under.
const oracleName = "runrecordd.local/oracle:1"

// TestScripts runs the commands a user types, in testdata/script/*.txtar.
//
// Each script gets, besides $WORK:
//
//	$STATE, $STATE2      short state directories for a daemon each (a unix
//	                     socket path must fit in 108 bytes; $WORK's does not)
//	RUNRECORDD_SOCKET    $STATE/runrecordd.sock
//	oracle.tar           the state-oracle unit as an OCI archive ([daemon] only)
//	sample.json          testdata/records/sample.json
//
// and the commands exits, waitsock, waitline, jsonfield, truncate and
// flipbyte (see scriptCmds).
func TestScripts(t *testing.T) {
	daemon := false
	var oracle string
	if os.Getenv(skipEnv) == "1" {
		t.Logf("%s=1: skipping the daemon scripts (real containerd, runc and CRIU as root); the others run", skipEnv)
	} else {
		if err := preflight(); err != nil {
			t.Fatalf("\n*** the daemon scripts need root, containerd, runc and a CRIU whose `criu check` passes:\n*** %v\n*** run deploy/setup.sh as root, or set %s=1 to skip them.", err, skipEnv)
		}
		daemon = true
		oracle = buildOracle(t)
	}
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Condition: func(cond string) (bool, error) {
			if cond == "daemon" {
				return daemon, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: scriptCmds,
		Setup: func(env *testscript.Env) error {
			b, err := os.ReadFile("../../testdata/records/sample.json")
			if err != nil {
				return err
			}
			if err := os.WriteFile(env.WorkDir+"/sample.json", b, 0o644); err != nil {
				return err
			}
			if oracle != "" {
				if err := linkOrCopy(oracle, filepath.Join(env.WorkDir, "oracle.tar")); err != nil {
					return err
				}
			}
			return stateDirs(env)
		},
	})
}

// preflight says what a daemon script would miss on this host.
func preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	for _, bin := range []string{"containerd", "runc", "iptables-restore", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return criu.Check(ctx, "")
}

// buildOracle builds units/oracle into an OCI archive, once per test run,
// as cmd/mkunit does.
func buildOracle(t *testing.T) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := ociarchive.GoBinary(ctx, "../..", "./units/oracle")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "oracle.tar")
	if _, err := ociarchive.WriteFile(path, ociarchive.Unit(oracleName, bin)); err != nil {
		t.Fatal(err)
	}
	return path
}

func linkOrCopy(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// stateDirs makes $STATE and $STATE2. At the script's end, before its
// background daemons are interrupted, it closes any run still executing
// (a failed script must not leave sandboxes behind: they outlive their
// daemon); after the script, it removes the directories if the script
// passed, and keeps them, saying where, for the daemon's logs if not.
func stateDirs(env *testscript.Env) error {
	t, ok := env.T().(interface {
		Cleanup(func())
		Failed() bool
		Logf(string, ...any)
	})
	if !ok {
		return fmt.Errorf("testscript.T is %T, not a *testing.T", env.T())
	}
	var dirs []string
	for _, name := range []string{"STATE", "STATE2"} {
		dir, err := os.MkdirTemp("", "rrs-")
		if err != nil {
			return err
		}
		dirs = append(dirs, dir)
		env.Setenv(name, dir)
	}
	env.Setenv("RUNRECORDD_SOCKET", filepath.Join(dirs[0], "runrecordd.sock"))
	env.Defer(func() {
		for _, dir := range dirs {
			if msg := closeRuns(filepath.Join(dir, "runrecordd.sock")); msg != "" {
				t.Logf("%s", msg)
			}
		}
	})
	t.Cleanup(func() {
		for _, dir := range dirs {
			if os.Remove(dir) == nil { // unused
				continue
			}
			if t.Failed() {
				t.Logf("daemon state kept in %s", dir)
				continue
			}
			if m := mountsUnder(dir); len(m) > 0 {
				t.Logf("daemon state kept in %s: still mounted there: %s", dir, strings.Join(m, " "))
				continue
			}
			_ = os.RemoveAll(dir)
		}
	})
	return nil
}

// closeRuns closes every executing run of the daemon on socket, if one
// answers there, and says which it closed.
func closeRuns(socket string) string {
	if _, err := os.Stat(socket); err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := api.NewClient(socket)
	runs, err := c.List(ctx, "executing")
	if err != nil {
		return fmt.Sprintf("cleanup: list runs on %s: %v", socket, err)
	}
	var msgs []string
	for _, r := range runs {
		if _, err := c.Close(ctx, r.ID, "test cleanup"); err != nil {
			msgs = append(msgs, fmt.Sprintf("cleanup: close %s on %s: %v", r.ID, socket, err))
			continue
		}
		msgs = append(msgs, fmt.Sprintf("cleanup: closed %s left executing on %s", r.ID, socket))
	}
	return strings.Join(msgs, "\n")
}

// mountsUnder lists the mount points at or under dir.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if mp := fields[4]; mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// scriptCmds are the commands the scripts add to testscript's own.
var scriptCmds = map[string]func(ts *testscript.TestScript, neg bool, args []string){
	"exits":     cmdExits,
	"waitsock":  cmdWaitsock,
	"waitline":  cmdWaitline,
	"jsonfield": cmdJSONField,
	"setjson":   cmdSetJSON,
	"truncate":  cmdTruncate,
	"flipbyte":  cmdFlipByte,
}

// exits CODE PROG [ARGS...] runs PROG like exec and checks it exits with
// status CODE; stdout and stderr are its own, as after exec.
func cmdExits(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! exits")
	}
	if len(args) < 2 {
		ts.Fatalf("usage: exits CODE PROG [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("exits: %q is not an exit status", args[0])
	}
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("exits: %v", err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited with status %d, want %d", args[1], got, want)
	}
}

// waitsock SOCKET [SECONDS] waits until a daemon answers on SOCKET
// (default 60 s): the socket exists before the daemon serves, so it asks
// for the host's facts.
func cmdWaitsock(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: waitsock SOCKET [SECONDS]")
	}
	limit := waitLimit(ts, args[1:], 60)
	sock := ts.MkAbs(args[0])
	deadline := time.Now().Add(limit)
	var err error
	for time.Now().Before(deadline) {
		if _, err = os.Stat(sock); err == nil {
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			_, err = api.NewClient(sock).Host(ctx)
			cancel()
			if err == nil {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	ts.Fatalf("no daemon answered on %s within %s: %v", sock, limit, err)
}

// waitline FILE REGEXP [SECONDS] waits until a line of FILE matches
// REGEXP (default 30 s); FILE need not exist yet.
func cmdWaitline(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 || len(args) > 3 {
		ts.Fatalf("usage: waitline FILE REGEXP [SECONDS]")
	}
	limit := waitLimit(ts, args[2:], 30)
	re, err := regexp.Compile("(?m)" + args[1])
	ts.Check(err)
	path := ts.MkAbs(args[0])
	deadline := time.Now().Add(limit)
	var data []byte
	for {
		data, _ = os.ReadFile(path)
		if re.Match(data) {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	ts.Fatalf("no line of %s matched %q within %s; its last lines:\n%s", args[0], args[1], limit,
		strings.Join(lines[max(0, len(lines)-3):], "\n"))
}

func waitLimit(ts *testscript.TestScript, args []string, def int) time.Duration {
	if len(args) == 0 {
		return time.Duration(def) * time.Second
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n <= 0 {
		ts.Fatalf("%q is not a number of seconds", args[0])
	}
	return time.Duration(n) * time.Second
}

// jsonfield FILE PATH REGEXP checks that FILE (or stdout, stderr) is JSON
// and that the value at PATH — keys and array indexes joined by dots,
// e.g. segments.0.kind — matches REGEXP in full: a string as itself,
// anything else as its JSON. With !, the value must not match (or be
// absent).
func cmdJSONField(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 3 {
		ts.Fatalf("usage: jsonfield FILE PATH REGEXP")
	}
	var v any
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &v); err != nil {
		ts.Fatalf("%s is not JSON: %v", args[0], err)
	}
	re, err := regexp.Compile("^(?:" + args[2] + ")$")
	ts.Check(err)
	got, err := jsonAt(v, args[1])
	if err != nil {
		if neg {
			return
		}
		ts.Fatalf("%s: %v", args[0], err)
	}
	s, ok := got.(string)
	if !ok {
		b, _ := json.Marshal(got)
		s = string(b)
	}
	switch m := re.MatchString(s); {
	case m && neg:
		ts.Fatalf("%s: %s is %s, which matches %q", args[0], args[1], s, args[2])
	case !m && !neg:
		ts.Fatalf("%s: %s is %s, not %q", args[0], args[1], s, args[2])
	}
}

// setjson VAR FILE PATH sets the environment variable VAR to the string
// at PATH of the JSON in FILE (or stdout, stderr).
func cmdSetJSON(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: setjson VAR FILE PATH")
	}
	var v any
	if err := json.Unmarshal([]byte(ts.ReadFile(args[1])), &v); err != nil {
		ts.Fatalf("%s is not JSON: %v", args[1], err)
	}
	got, err := jsonAt(v, args[2])
	ts.Check(err)
	s, ok := got.(string)
	if !ok {
		ts.Fatalf("%s: %s is a %T, not a string", args[1], args[2], got)
	}
	ts.Setenv(args[0], s)
}

func jsonAt(v any, path string) (any, error) {
	for i, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[k]; !ok {
				return nil, fmt.Errorf("no %q at %s", k, strings.Join(strings.Split(path, ".")[:i+1], "."))
			}
		case []any:
			n, err := strconv.Atoi(k)
			if err != nil || n < 0 || n >= len(x) {
				return nil, fmt.Errorf("no element %q in an array of %d", k, len(x))
			}
			v = x[n]
		default:
			return nil, fmt.Errorf("%s: %q under a %T", path, k, v)
		}
	}
	return v, nil
}

// truncate FILE BYTES cuts FILE to its first BYTES bytes.
func cmdTruncate(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: truncate FILE BYTES")
	}
	n, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil {
		ts.Fatalf("truncate: %q is not a size", args[1])
	}
	path := ts.MkAbs(args[0])
	st, err := os.Stat(path)
	ts.Check(err)
	if st.Size() <= n {
		ts.Fatalf("truncate: %s has %d bytes, not more than %d", args[0], st.Size(), n)
	}
	ts.Check(os.Truncate(path, n))
}

// flipbyte FILE OFFSET inverts the bits of FILE's byte at OFFSET.
func cmdFlipByte(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: flipbyte FILE OFFSET")
	}
	off, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil || off < 0 {
		ts.Fatalf("flipbyte: %q is not an offset", args[1])
	}
	f, err := os.OpenFile(ts.MkAbs(args[0]), os.O_RDWR, 0)
	ts.Check(err)
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		ts.Fatalf("flipbyte: %s: %v", args[0], err)
	}
	b[0] = ^b[0]
	_, err = f.WriteAt(b[:], off)
	ts.Check(err)
}
