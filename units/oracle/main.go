// Command oracle is a state-oracle unit in the spirit of CRIU's zdtm tests:
// it holds state of several kinds a checkpoint must carry, and reports all of
// it as one JSON line on stdout every tick, so a test can compare the lines
// before a park with the lines after the resume.
//
// The state:
//
//   - a buffer (SIZE_MB, default 64 MiB) filled from a fixed xorshift seed;
//     its SHA-256 is taken once at start ("checksum") and recomputed over
//     the live buffer every VERIFY_EVERY ticks (default 10) and on SIGUSR1
//     ("verify", "verified_at"), so a restored buffer is checked byte for
//     byte, not only remembered;
//   - a counter incremented every TICK_MS (default 100 ms);
//   - /tmp/oracle.dat (OUT_FILE), opened once and never reopened: a 4 KiB
//     header, then one 8-byte big-endian record per tick, so its offset is
//     4096 + 8·counter; at every verification the file is read back through
//     the same descriptor and checked ("file_ok");
//   - a child process (this program re-executed as "echo-child") joined by
//     two pipes: the parent writes each tick's sequence number, the child
//     echoes it, the parent checks the echo ("pipe_seq");
//   - the start time and the pids, which a resumed process keeps and a
//     restarted one does not;
//   - whether loopback is up ("lo_up"), re-read at every verification, so
//     a test sees the sandbox's network grant;
//   - with TCP_PORT set (a sandbox with loopback up), TCP state: a server
//     listening on 127.0.0.1:TCP_PORT that echoes what it reads, one
//     connection to it held open from the start, through which every tick
//     sends its sequence number and checks the echo ("tcp_held", its local
//     port "tcp_held_port"), and one fresh connection per tick
//     ("tcp_fresh_ok", "tcp_fresh_fail"); "tcp_mptcp" reports a connection
//     that got MPTCP, which CRIU cannot dump.
//
// A broken invariant prints a line with "error" set and exits with status 3.
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

const headerSize = 4096

// errBroken ends a run whose state no longer matches what it was.
var errBroken = errors.New("state invariant broken")

// Line is one report; the executor tests decode it.
type Line struct {
	Counter    uint64 `json:"counter"`
	Checksum   string `json:"checksum"`
	Verify     string `json:"verify"`
	VerifiedAt uint64 `json:"verified_at"`
	FileOffset int64  `json:"file_offset"`
	FileOK     bool   `json:"file_ok"`
	PipeSeq    uint64 `json:"pipe_seq"`
	LoUp       bool   `json:"lo_up"`
	// TCP state, with TCP_PORT set.
	TCPHeld      uint64 `json:"tcp_held,omitempty"`
	TCPHeldPort  int    `json:"tcp_held_port,omitempty"`
	TCPFreshOK   uint64 `json:"tcp_fresh_ok,omitempty"`
	TCPFreshFail uint64 `json:"tcp_fresh_fail,omitempty"`
	TCPMPTCP     bool   `json:"tcp_mptcp,omitempty"`
	Pid          int    `json:"pid"`
	ChildPid     int    `json:"child_pid"`
	StartTime    int64  `json:"start_time"`
	Time         int64  `json:"time"`
	Error        string `json:"error,omitempty"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "echo-child" {
		if err := echo(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "oracle echo-child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "oracle:", err)
		if errors.Is(err, errBroken) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

// echo copies 8-byte records from r back to w, one at a time.
func echo(r io.Reader, w io.Writer) error {
	var rec [8]byte
	for {
		if _, err := io.ReadFull(r, rec[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if _, err := w.Write(rec[:]); err != nil {
			return err
		}
	}
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return def
}

// fill writes the deterministic pattern: xorshift64 from a fixed seed.
func fill(buf []byte) {
	x := uint64(0x9E3779B97F4A7C15)
	for i := 0; i+8 <= len(buf); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(buf[i:], x)
	}
}

func sum(buf []byte) string {
	s := sha256.Sum256(buf)
	return hex.EncodeToString(s[:])
}

func run() error {
	start := time.Now()
	size := envInt("SIZE_MB", 64) << 20
	tick := time.Duration(envInt("TICK_MS", 100)) * time.Millisecond
	verifyEvery := uint64(envInt("VERIFY_EVERY", 10))
	path := os.Getenv("OUT_FILE")
	if path == "" {
		path = "/tmp/oracle.dat"
	}

	buf := make([]byte, size)
	fill(buf)
	checksum := sum(buf)

	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	header := make([]byte, headerSize)
	fill(header)
	if _, err := f.Write(header); err != nil {
		return err
	}

	childStdin, toChild, err := os.Pipe()
	if err != nil {
		return err
	}
	fromChild, childStdout, err := os.Pipe()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, "echo-child")
	child.Stdin = childStdin
	child.Stdout = childStdout
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		return err
	}
	childStdin.Close()
	childStdout.Close()
	echoes := bufio.NewReader(fromChild)

	var tcp *tcpState
	if port := envInt("TCP_PORT", 0); port != 0 {
		if tcp, err = startTCP(port); err != nil {
			return err
		}
	}

	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)

	enc := json.NewEncoder(os.Stdout)
	line := Line{
		Checksum:   checksum,
		Verify:     checksum,
		Pid:        os.Getpid(),
		ChildPid:   child.Process.Pid,
		StartTime:  start.UnixNano(),
		FileOffset: headerSize,
		FileOK:     true,
		LoUp:       loUp(),
	}
	fail := func(format string, args ...any) error {
		line.Error = fmt.Sprintf(format, args...)
		line.Time = time.Now().UnixNano()
		_ = enc.Encode(&line)
		return errBroken
	}
	verify := func() error {
		line.LoUp = loUp()
		line.Verify = sum(buf)
		line.VerifiedAt = line.Counter
		if line.Verify != checksum {
			return fail("buffer checksum %s, want %s", line.Verify, checksum)
		}
		ok, err := checkFile(f, header, line.Counter)
		if err != nil {
			return fail("read back %s: %v", path, err)
		}
		line.FileOK = ok
		if !ok {
			return fail("%s does not hold the header and records 0..%d", path, line.Counter)
		}
		return nil
	}

	t := time.NewTicker(tick)
	defer t.Stop()
	var rec, got [8]byte
	for {
		select {
		case <-usr1:
			// Verify now and report, without a tick.
			if err := verify(); err != nil {
				return err
			}
			line.Time = time.Now().UnixNano()
			if err := enc.Encode(&line); err != nil {
				return err
			}
			continue
		case <-t.C:
		}
		// One tick: a file record, a pipe round trip, the counter.
		binary.BigEndian.PutUint64(rec[:], line.Counter)
		if _, err := f.Write(rec[:]); err != nil {
			return fail("write %s: %v", path, err)
		}
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return fail("seek %s: %v", path, err)
		}
		if want := int64(headerSize) + 8*int64(line.Counter+1); off != want {
			return fail("file offset %d, want %d", off, want)
		}
		line.FileOffset = off
		if _, err := toChild.Write(rec[:]); err != nil {
			return fail("write pipe: %v", err)
		}
		if _, err := io.ReadFull(echoes, got[:]); err != nil {
			return fail("read pipe: %v", err)
		}
		if got != rec {
			return fail("pipe echoed %x, want %x", got, rec)
		}
		line.PipeSeq = line.Counter
		if tcp != nil {
			if err := tcp.tick(&line, rec); err != nil {
				return fail("%v", err)
			}
		}
		line.Counter++
		if line.Counter%verifyEvery == 0 {
			if err := verify(); err != nil {
				return err
			}
		}
		line.Time = time.Now().UnixNano()
		if err := enc.Encode(&line); err != nil {
			return err
		}
	}
}

// loUp reports whether the loopback interface is up in the unit's network
// namespace.
func loUp() bool {
	lo, err := net.InterfaceByName("lo")
	return err == nil && lo.Flags&net.FlagUp != 0
}

// checkFile reads the file back through its open descriptor (without moving
// its offset) and checks the header and the records 0..n-1.
func checkFile(f *os.File, header []byte, n uint64) (bool, error) {
	data := make([]byte, headerSize+8*int(n))
	if _, err := f.ReadAt(data, 0); err != nil {
		return false, err
	}
	if string(data[:headerSize]) != string(header) {
		return false, nil
	}
	for i := uint64(0); i < n; i++ {
		if binary.BigEndian.Uint64(data[headerSize+8*i:]) != i {
			return false, nil
		}
	}
	return true, nil
}

// tcpState is the unit's TCP state: an echo server on loopback and a
// connection to it held open.
type tcpState struct {
	addr  string
	held  net.Conn
	mptcp bool
}

func startTCP(port int) (*tcpState, error) {
	// Go listens with MPTCP by default where the kernel offers it; the
	// sandbox turns MPTCP off, so this is a plain TCP listener there.
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, err
	}
	t := &tcpState{addr: l.Addr().String()}
	accepted := make(chan bool, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				mp, _ := tc.MultipathTCP()
				select {
				case accepted <- mp:
				default:
				}
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	if t.held, err = net.Dial("tcp", t.addr); err != nil {
		return nil, err
	}
	t.mptcp = <-accepted
	return t, nil
}

// tick sends rec through the held connection and checks the echo (no
// deadline: a park may freeze the unit in the middle), then makes one
// fresh connection.
func (t *tcpState) tick(l *Line, rec [8]byte) error {
	var got [8]byte
	if _, err := t.held.Write(rec[:]); err != nil {
		return fmt.Errorf("held connection: write: %v", err)
	}
	if _, err := io.ReadFull(t.held, got[:]); err != nil {
		return fmt.Errorf("held connection: read: %v", err)
	}
	if got != rec {
		return fmt.Errorf("held connection echoed %x, want %x", got, rec)
	}
	l.TCPHeld++
	l.TCPHeldPort = t.held.LocalAddr().(*net.TCPAddr).Port
	l.TCPMPTCP = t.mptcp
	if fresh(t.addr, rec) {
		l.TCPFreshOK++
	} else {
		l.TCPFreshFail++
	}
	return nil
}

// fresh connects anew, sends rec and checks the echo, within a second.
func fresh(addr string, rec [8]byte) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	var got [8]byte
	if _, err := c.Write(rec[:]); err != nil {
		return false
	}
	_, err = io.ReadFull(c, got[:])
	return err == nil && got == rec
}
