package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// The peer listener's defaults (docs/fleet.md, "Peer listener and keys").
const (
	// DefaultConns is how many connections the listener holds at once, in
	// total, handshakes under way included.
	DefaultConns = 512
	// DefaultPerSource is how many of them one source may hold: an IPv4
	// address, or an IPv6 /64.
	DefaultPerSource = 64
	// DefaultHandshake is a TLS handshake's deadline, from the accept to
	// its end, the admission check included.
	DefaultHandshake = 5 * time.Second
)

// Limits bound what the peer listener accepts: a connection past either
// count is closed as it is accepted, before a byte of it is read; a
// handshake not done by its deadline is cut. Zero fields take the
// defaults.
type Limits struct {
	Conns     int
	PerSource int
	Handshake time.Duration
}

func (l Limits) or() Limits {
	if l.Conns <= 0 {
		l.Conns = DefaultConns
	}
	if l.PerSource <= 0 {
		l.PerSource = DefaultPerSource
	}
	if l.Handshake <= 0 {
		l.Handshake = DefaultHandshake
	}
	return l
}

// Listen listens on addr (TCP) and serves TLS with cfg, which must
// require and verify client certificates (a [ServerConfig]): a
// configuration that does not is refused rather than served. It holds
// connections to lim, and hands Accept only connections whose handshake
// ended, admitted, within lim.Handshake: a client that stalls, or whose
// admission waits, costs the server a goroutine until then, never the
// HTTP server's attention.
func Listen(addr string, cfg *tls.Config, lim Limits) (net.Listener, error) {
	if cfg == nil || cfg.ClientAuth != tls.RequireAnyClientCert || cfg.VerifyConnection == nil ||
		len(cfg.Certificates) != 0 || cfg.GetCertificate == nil {
		return nil, errors.New("peer: listen: not a peer.ServerConfig")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer: %w", err)
	}
	l := &listener{Listener: ln, cfg: cfg, lim: lim.or(), by: map[string]int{},
		ready: make(chan net.Conn), done: make(chan struct{})}
	go l.loop()
	return l, nil
}

// listener is Listen's: it accepts, counts and handshakes; Accept takes
// the connections whose handshake ended.
type listener struct {
	net.Listener
	cfg   *tls.Config
	lim   Limits
	ready chan net.Conn
	done  chan struct{}
	once  sync.Once

	mu  sync.Mutex
	err error // why loop ended
	n   int
	by  map[string]int // connections by source (sourceOf)
	end context.CancelFunc
}

func (l *listener) loop() {
	ctx, cancel := context.WithCancel(context.Background())
	l.mu.Lock()
	l.end = cancel
	l.mu.Unlock()
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			l.Close()
			return
		}
		src := sourceOf(c)
		if !l.take(src) {
			c.Close()
			continue
		}
		go l.handshake(ctx, &counted{Conn: c, l: l, src: src})
	}
}

// handshake ends c's TLS handshake within the deadline and hands it to
// Accept, or closes it.
func (l *listener) handshake(ctx context.Context, c *counted) {
	hctx, cancel := context.WithTimeout(ctx, l.lim.Handshake)
	defer cancel()
	_ = c.SetDeadline(time.Now().Add(l.lim.Handshake))
	tc := tls.Server(c, l.cfg)
	if err := tc.HandshakeContext(hctx); err != nil {
		tc.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	select {
	case l.ready <- tc:
	case <-l.done:
		tc.Close()
	case <-hctx.Done():
		// Accept was not called in time: the server is busy or closing.
		tc.Close()
	}
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		err := l.err
		l.mu.Unlock()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		return nil, net.ErrClosed
	}
}

// Close stops accepting and cuts the handshakes under way; connections
// Accept returned are the server's to close.
func (l *listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.Listener.Close()
		l.mu.Lock()
		if l.end != nil {
			l.end()
		}
		l.mu.Unlock()
	})
	return err
}

// take counts a connection from src, unless a count is at its limit.
func (l *listener) take(src string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= l.lim.Conns || l.by[src] >= l.lim.PerSource {
		return false
	}
	l.n++
	l.by[src]++
	return true
}

func (l *listener) release(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.by[src]--; l.by[src] <= 0 {
		delete(l.by, src)
	}
}

// sourceOf is the source c's remote address counts against: an IPv4
// address (IPv4-mapped IPv6 included) as itself, an IPv6 address by its
// /64, since one host is commonly given a whole /64 and could otherwise
// take a slot of its own per address.
func sourceOf(c net.Conn) string {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return c.RemoteAddr().String()
	}
	if v4 := a.IP.To4(); v4 != nil {
		return v4.String()
	}
	return (&net.IPNet{IP: a.IP.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
}

// counted is a connection the listener counts until it is closed.
type counted struct {
	net.Conn
	l    *listener
	src  string
	once sync.Once
}

func (c *counted) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.src) })
	return err
}
