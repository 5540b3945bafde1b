package main

// Attacks on the transcript unit's channel (docs/trust.md, "What a unit can
// reach: the channel"). Each runs in a transcript-mode sandbox, with the
// channel directory at /run/runrecordd (RUNRECORDD_DIR overrides it).
//
//   - transcript-symlink: replaces the transcript with a symlink to TARGET
//     (a host path), appends a line through the socket and awaits a call,
//     so that the daemon appends to and seals whatever the link names.
//   - transcript-fifo: replaces the transcript with a FIFO; with AWAIT=1 it
//     then awaits a call (the park reads the transcript), without it it
//     idles (a restarted daemon recovers the transcript).
//   - channel-flood: opens CONNS connections (default 64), says hello on
//     each, and then holds an unterminated line of LINE bytes (default
//     1 MiB - 1) on every one the daemon kept.
//   - channel-limits: appends APPENDS lines of 1 KiB, dispatches a call with
//     a payload of BIG bytes, then small calls until one is refused, and
//     awaits the first: each refusal is reported by its code.
//   - long-call-id: dispatches a call with an id of IDLEN bytes (default
//     200) and awaits it; started again with its result, reads it.
//   - channel-payload: appends MIB MiB (default 96) to its transcript in
//     appends of 900 KiB, all in one interval, and reports the size.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/runrecordd/runrecordd/pkg/protocol"
)

func channelDir() string {
	if d := os.Getenv("RUNRECORDD_DIR"); d != "" {
		return d
	}
	return protocol.Dir
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// dial connects to the channel and says hello, or says why not and idles.
func dial() *protocol.Client {
	c, err := protocol.Dial(filepath.Join(channelDir(), protocol.SocketFile))
	if err != nil {
		say("dial: %v", err)
		idle()
	}
	h, err := c.Hello(context.Background())
	if err != nil {
		say("hello: %v", err)
		idle()
	}
	say("hello: run %s interval %d", h.Run, h.Interval)
	return c
}

// code is err's protocol code, or its text.
func code(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// replaceTranscript removes the transcript and makes something else in its
// place; it reports what happened.
func replaceTranscript(make func(path string) error) {
	p := filepath.Join(channelDir(), protocol.TranscriptFile)
	err := os.Remove(p)
	if err == nil {
		err = make(p)
	}
	if err != nil {
		say("replace: refused: %v", err)
		return
	}
	say("replace: done")
}

// awaitOne dispatches call id and awaits it, which parks the run.
func awaitOne(c *protocol.Client, id string) {
	ctx := context.Background()
	if err := c.Dispatch(ctx, protocol.Call{ID: id, Kind: "hostile"}); err != nil {
		say("dispatch: %s", code(err))
		return
	}
	parking, err := c.Await(ctx, id)
	say("await: parking=%v err=%s", parking, code(err))
}

func init() {
	attacks["transcript-symlink"] = func() {
		c := dial()
		target := os.Getenv("TARGET")
		replaceTranscript(func(p string) error { return os.Symlink(target, p) })
		size, err := c.Append(context.Background(), []byte("hostile line\n"))
		say("append: size %d err %s", size, code(err))
		awaitOne(c, "c1")
	}
	attacks["transcript-fifo"] = func() {
		c := dial()
		replaceTranscript(func(p string) error { return syscall.Mkfifo(p, 0o600) })
		size, err := c.Append(context.Background(), []byte("hostile line\n"))
		say("append: size %d err %s", size, code(err))
		if os.Getenv("AWAIT") == "1" {
			awaitOne(c, "c1")
			return
		}
		say("idling")
	}
	attacks["channel-flood"] = channelFlood
	attacks["channel-limits"] = channelLimits
	attacks["long-call-id"] = longCallID
	attacks["channel-payload"] = channelPayload
}

// channelFlood opens many connections and holds a long unterminated line
// on each the daemon keeps.
func channelFlood() {
	n, size := envInt("CONNS", 64), envInt("LINE", 1<<20-1)
	sock := filepath.Join(channelDir(), protocol.SocketFile)
	var kept []net.Conn
	refused := map[string]int{}
	for range n {
		nc, err := net.Dial("unix", sock)
		if err != nil {
			refused["dial: "+err.Error()]++
			continue
		}
		// The daemon answers the hello, or refuses the connection
		// with a line of its own, sent as it accepts.
		fmt.Fprintf(nc, `{"op":"hello"}`+"\n")
		line, err := bufio.NewReader(nc).ReadString('\n')
		var resp protocol.Response
		if err != nil || json.Unmarshal([]byte(line), &resp) != nil {
			refused[fmt.Sprintf("no answer: %v", err)]++
			nc.Close()
			continue
		}
		if !resp.OK {
			refused[resp.Code]++
			nc.Close()
			continue
		}
		kept = append(kept, nc)
	}
	say("connections: kept %d refused %v", len(kept), refused)
	done := make(chan string, len(kept))
	line := []byte(`{"op":"append","data":"` + strings.Repeat("a", size-24))
	for _, nc := range kept {
		go func() {
			_, err := nc.Write(line)
			done <- fmt.Sprint(err)
		}()
	}
	// Each write returns once the daemon has read (or the socket holds)
	// it; one that cannot go on is stuck until the daemon reads more.
	for range kept {
		<-done
	}
	say("holding %d unterminated lines", len(kept))
}

// channelLimits runs into the per-interval limits of its grant set.
func channelLimits() {
	c := dial()
	ctx := context.Background()
	var codes []string
	for i := range envInt("APPENDS", 5) {
		line := fmt.Sprintf("%04d%s\n", i, strings.Repeat("t", 1019))
		_, err := c.Append(ctx, []byte(line))
		codes = append(codes, code(err))
	}
	say("appends: %s", strings.Join(codes, " "))
	big := `"` + strings.Repeat("p", envInt("BIG", 32<<10)) + `"`
	err := c.Dispatch(ctx, protocol.Call{ID: "big", Kind: "hostile", Payload: json.RawMessage(big)})
	say("big dispatch: %s", code(err))
	codes = nil
	for i := 1; i <= 64; i++ {
		err := c.Dispatch(ctx, protocol.Call{ID: fmt.Sprintf("c%d", i), Kind: "hostile"})
		codes = append(codes, code(err))
		if err != nil {
			break
		}
	}
	say("dispatches: %s", strings.Join(codes, " "))
	parking, err := c.Await(ctx, "c1")
	say("await: parking=%v err=%s", parking, code(err))
}

// longCallID dispatches a call whose id is IDLEN bytes long and awaits it.
func longCallID() {
	c := dial()
	ctx := context.Background()
	id := strings.Repeat("i", envInt("IDLEN", 200))
	t, err := os.ReadFile(filepath.Join(channelDir(), protocol.TranscriptFile))
	if err != nil {
		say("transcript: %v", err)
		return
	}
	if len(t) == 0 {
		if _, err := c.Append(ctx, []byte("dispatched\n")); err != nil {
			say("append: %s", code(err))
			return
		}
		awaitOne(c, id)
		return
	}
	r, ok, err := c.Result(ctx, id)
	say("result: ok=%v err=%s payload=%s", ok, code(err), r.Payload)
}

// channelPayload appends MIB MiB in one interval: all of it would be held
// by a daemon that keeps an interval's journal in memory until the seal.
func channelPayload() {
	c := dial()
	ctx := context.Background()
	want := int64(envInt("MIB", 96)) << 20
	chunk := []byte(strings.Repeat("a", 900<<10-1) + "\n")
	var size int64
	for size < want {
		n, err := c.Append(ctx, chunk[:min(int64(len(chunk)), want-size)])
		if err != nil {
			say("append: %s at %d", code(err), size)
			return
		}
		size = n
	}
	say("appended %d", size)
}
