package main

import (
	"fmt"
	"io"
	"net"
	"time"
)

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
