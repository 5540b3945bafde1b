package protocol

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
)

// conn is one connection.
type conn struct {
	s  *Server
	nc net.Conn
}

func (c *conn) serve() {
	s := c.s
	defer func() {
		c.nc.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()

	r := bufio.NewReaderSize(c.nc, connBuffer)
	w := bufio.NewWriter(c.nc)
	for {
		if !c.step(ctx, r, w) {
			return
		}
	}
}

// connBuffer is a connection's read buffer.
const connBuffer = 16 << 10

// step reads one request and answers it; it reports whether the
// connection goes on. The request's bytes are held against the in-flight
// budget until it is handled.
func (c *conn) step(ctx context.Context, r *bufio.Reader, w *bufio.Writer) bool {
	s := c.s
	line, held, err := readLine(r, s.maxLine, s.take)
	release := func() { s.release(held); held = 0 }
	defer release()
	if err != nil && !errors.Is(err, ErrLineTooLong) && !errors.Is(err, ErrInFlight) {
		return false // EOF, a closed connection, or a line cut short by EOF
	}
	if !c.setBusy(true) {
		return false // shutting down: a request read now is not answered
	}
	var resp Response
	var hangUp bool
	switch {
	case errors.Is(err, ErrLineTooLong):
		resp = refusal(fmt.Errorf("%w: more than %d bytes", err, s.maxLine))
	case err != nil:
		resp = refusal(fmt.Errorf("%w: the channel holds at most %d bytes of unanswered requests across its connections", err, s.maxInFlight))
	default:
		resp, hangUp = s.handle(ctx, line)
	}
	// The line is done with: its bytes are free before its answer is
	// sent, so a peer that has its answer finds them free.
	release()
	b, err := json.Marshal(resp)
	if err != nil {
		b, _ = json.Marshal(refusal(ErrInternal))
	}
	w.Write(b)
	w.WriteByte('\n')
	if err := w.Flush(); err != nil || hangUp || !c.setBusy(false) {
		return false
	}
	return true
}

// setBusy marks the connection busy or idle; it reports false when the
// server is shutting down and the connection should end.
func (c *conn) setBusy(busy bool) bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.closing {
		return false
	}
	c.s.conns[c] = busy
	return true
}

// readLine reads one line of at most maxLen bytes, without its newline. A
// longer line is read to its newline and discarded, and readLine returns
// ErrLineTooLong. Before the line grows its buffer, take is asked for the
// bytes it grows by; when take refuses, the line is read to its newline
// and discarded, and readLine returns ErrInFlight. held is what take
// granted, for the caller to give back once the line is answered, whatever
// the error. A line cut short by EOF is io.ErrUnexpectedEOF.
func readLine(r *bufio.Reader, maxLen int, take func(int) bool) (line []byte, held int, err error) {
	for {
		frag, err := r.ReadSlice('\n')
		n := len(frag)
		if err == nil {
			n-- // the newline
		}
		var refuse error
		need := len(line) + n
		switch {
		case need > maxLen:
			refuse = ErrLineTooLong
		case need > cap(line):
			// Grown by doubling, never past maxLen: held is the
			// buffer's whole capacity.
			// When the budget cannot give that much, the line takes
			// exactly what it needs, or is refused.
			c := min(max(need, 2*cap(line), 512), maxLen)
			if !take(c - cap(line)) {
				if c = need; !take(c - cap(line)) {
					refuse = ErrInFlight
					break
				}
			}
			held += c - cap(line)
			line = append(make([]byte, 0, c), line...)
		}
		if refuse != nil {
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			if err != nil {
				return nil, held, unexpected(err)
			}
			return nil, held, refuse
		}
		line = append(line, frag[:n]...)
		switch {
		case err == nil:
			return line, held, nil
		case err != bufio.ErrBufferFull:
			if len(line) == 0 {
				return nil, held, err
			}
			return nil, held, unexpected(err)
		}
	}
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
