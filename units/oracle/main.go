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
//   - with SECRET_FILE set (a secret's file, /run/secrets/NAME), the
//     file's FNV-1a 64 hash and length ("secret", "%016x:LEN"), re-read
//     at every verification into one buffer that is cleared once hashed,
//     so a test sees what the unit read and no dump of its memory holds
//     it; a read that fails is reported in "secret_err";
//   - with FORK_ON_USR2=1, each SIGUSR2 forks a copy of the process that
//     pauses until killed (fork.go);
//   - with UFFD_REF_ON_USR2=epoll (or dup), each SIGUSR2 makes an epoll
//     listing every userfaultfd the process holds (or a second descriptor
//     of each), or closes it ("uffd_toggles", "uffd_refs"; uffd.go);
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
	Secret     string `json:"secret,omitempty"`
	SecretErr  string `json:"secret_err,omitempty"`
	// TCP state, with TCP_PORT set.
	TCPHeld      uint64 `json:"tcp_held,omitempty"`
	TCPHeldPort  int    `json:"tcp_held_port,omitempty"`
	TCPFreshOK   uint64 `json:"tcp_fresh_ok,omitempty"`
	TCPFreshFail uint64 `json:"tcp_fresh_fail,omitempty"`
	TCPMPTCP     bool   `json:"tcp_mptcp,omitempty"`
	Pid          int    `json:"pid"`
	ChildPid     int    `json:"child_pid"`
	// BufAddr is the buffer's address, with FORK_ON_USR2=1 (fork.go).
	BufAddr uint64 `json:"buf_addr,omitempty"`
	// UffdToggles and UffdRefs, with UFFD_REF_ON_USR2 set (uffd.go).
	UffdToggles uint64 `json:"uffd_toggles,omitempty"`
	UffdRefs    int    `json:"uffd_refs,omitempty"`
	StartTime   int64  `json:"start_time"`
	Time        int64  `json:"time"`
	Error       string `json:"error,omitempty"`
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

// oracle is the unit's state and the line that reports it.
type oracle struct {
	path     string
	buf      []byte
	checksum string // of buf at start
	f        *os.File
	header   []byte
	toChild  *os.File
	echoes   *bufio.Reader
	tcp      *tcpState // nil without TCP_PORT
	// uffdRefs are the descriptors toggleUffdRefs made; usr2 delivers
	// the signals that toggle them (nil without UFFD_REF_ON_USR2).
	uffdRefs []int
	usr2     <-chan os.Signal
	enc      *json.Encoder
	line     Line
}

func run() error {
	start := time.Now()
	size := envInt("SIZE_MB", 64) << 20
	tick := time.Duration(envInt("TICK_MS", 100)) * time.Millisecond
	verifyEvery := uint64(envInt("VERIFY_EVERY", 10))
	o := &oracle{path: os.Getenv("OUT_FILE"), usr2: uffdRefSignals()}
	if o.path == "" {
		o.path = "/tmp/oracle.dat"
	}

	o.buf = make([]byte, size)
	fill(o.buf)
	o.checksum = sum(o.buf)
	if err := o.openFile(); err != nil {
		return err
	}
	childPid, err := o.startChild()
	if err != nil {
		return err
	}
	if port := envInt("TCP_PORT", 0); port != 0 {
		if o.tcp, err = startTCP(port); err != nil {
			return err
		}
	}

	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	bufAddr := forkOnUSR2(o.buf)

	o.enc = json.NewEncoder(os.Stdout)
	o.line = Line{
		Checksum:   o.checksum,
		Verify:     o.checksum,
		Pid:        os.Getpid(),
		ChildPid:   childPid,
		StartTime:  start.UnixNano(),
		FileOffset: headerSize,
		FileOK:     true,
		LoUp:       loUp(),
		BufAddr:    bufAddr,
	}
	return o.loop(tick, verifyEvery, usr1)
}

// openFile creates the output file and writes its header, leaving the
// descriptor's offset after it.
func (o *oracle) openFile() error {
	f, err := os.OpenFile(o.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	o.f = f
	o.header = make([]byte, headerSize)
	fill(o.header)
	_, err = f.Write(o.header)
	return err
}

// startChild starts the echo child joined by two pipes and returns its
// pid.
func (o *oracle) startChild() (int, error) {
	childStdin, toChild, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	fromChild, childStdout, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	child := exec.Command(self, "echo-child")
	child.Stdin = childStdin
	child.Stdout = childStdout
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		return 0, err
	}
	childStdin.Close()
	childStdout.Close()
	o.toChild = toChild
	o.echoes = bufio.NewReader(fromChild)
	return child.Process.Pid, nil
}

// loop ticks every tick, verifying every verifyEvery ticks and on each
// signal from usr1, and reports a line after each, until an invariant
// breaks or stdout fails.
func (o *oracle) loop(tick time.Duration, verifyEvery uint64, usr1 <-chan os.Signal) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-usr1:
			// Verify now and report, without a tick.
			if err := o.verify(); err != nil {
				return err
			}
			if err := o.report(); err != nil {
				return err
			}
			continue
		case <-o.usr2:
			if err := o.toggleUffdRefs(); err != nil {
				return err
			}
			if err := o.report(); err != nil {
				return err
			}
			continue
		case <-t.C:
		}
		if err := o.step(); err != nil {
			return err
		}
		o.line.Counter++
		if o.line.Counter%verifyEvery == 0 {
			if err := o.verify(); err != nil {
				return err
			}
		}
		if err := o.report(); err != nil {
			return err
		}
	}
}

// report writes the line, stamped with the time now.
func (o *oracle) report() error {
	o.line.Time = time.Now().UnixNano()
	return o.enc.Encode(&o.line)
}

// fail reports the line with the broken invariant set and returns
// errBroken.
func (o *oracle) fail(format string, args ...any) error {
	o.line.Error = fmt.Sprintf(format, args...)
	o.line.Time = time.Now().UnixNano()
	_ = o.enc.Encode(&o.line)
	return errBroken
}

// verify re-reads loopback's state, recomputes the buffer's checksum and
// reads the file back.
func (o *oracle) verify() error {
	o.line.LoUp = loUp()
	if p := os.Getenv("SECRET_FILE"); p != "" {
		o.line.Secret, o.line.SecretErr = readSecret(p)
	}
	o.line.Verify = sum(o.buf)
	o.line.VerifiedAt = o.line.Counter
	if o.line.Verify != o.checksum {
		return o.fail("buffer checksum %s, want %s", o.line.Verify, o.checksum)
	}
	ok, err := checkFile(o.f, o.header, o.line.Counter)
	if err != nil {
		return o.fail("read back %s: %v", o.path, err)
	}
	o.line.FileOK = ok
	if !ok {
		return o.fail("%s does not hold the header and records 0..%d", o.path, o.line.Counter)
	}
	return nil
}

// step is one tick: a file record, a pipe round trip and, with TCP_PORT,
// the TCP round trips.
func (o *oracle) step() error {
	var rec, got [8]byte
	binary.BigEndian.PutUint64(rec[:], o.line.Counter)
	if _, err := o.f.Write(rec[:]); err != nil {
		return o.fail("write %s: %v", o.path, err)
	}
	off, err := o.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return o.fail("seek %s: %v", o.path, err)
	}
	if want := int64(headerSize) + 8*int64(o.line.Counter+1); off != want {
		return o.fail("file offset %d, want %d", off, want)
	}
	o.line.FileOffset = off
	if _, err := o.toChild.Write(rec[:]); err != nil {
		return o.fail("write pipe: %v", err)
	}
	if _, err := io.ReadFull(o.echoes, got[:]); err != nil {
		return o.fail("read pipe: %v", err)
	}
	if got != rec {
		return o.fail("pipe echoed %x, want %x", got, rec)
	}
	o.line.PipeSeq = o.line.Counter
	if o.tcp != nil {
		if err := o.tcp.tick(&o.line, rec); err != nil {
			return o.fail("%v", err)
		}
	}
	return nil
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

// secretBuf is the one buffer a secret is read into (readSecret).
var secretBuf [4096]byte

// readSecret hashes the file at path (FNV-1a 64, in registers) and
// clears the bytes it read: "%016x:LEN", or the error.
func readSecret(path string) (string, string) {
	f, err := os.Open(path)
	if err != nil {
		return "", err.Error()
	}
	defer f.Close()
	n := 0
	for n < len(secretBuf) {
		m, err := f.Read(secretBuf[n:])
		n += m
		if err == io.EOF || m == 0 {
			break
		}
		if err != nil {
			clear(secretBuf[:n])
			return "", err.Error()
		}
	}
	h := uint64(14695981039346656037)
	for _, c := range secretBuf[:n] {
		h ^= uint64(c)
		h *= 1099511628211
	}
	clear(secretBuf[:n])
	return fmt.Sprintf("%016x:%d", h, n), ""
}
