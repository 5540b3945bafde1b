package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// DNSPort is the resolver's port on [GatewayAddr].
const DNSPort = 53

// The resolver's bounds on work: queries answered at once, in all and
// per run (more are dropped: the unit's resolver library asks again),
// and the time one may take.
const (
	dnsInFlight       = 64
	dnsInFlightPerRun = 4
	dnsQueryTime      = 5 * time.Second
)

// DNSConfig is what the runs' resolver needs.
type DNSConfig struct {
	Resolver *Resolver
	// Run is the run holding slot on this host, nil for none (its
	// queries are dropped).
	Run func(slot int) *Run
	// Resolved journals res, a resolution for the run holding slot,
	// before its addresses are allowed and the unit is answered; an
	// error answers the unit SERVFAIL and allows nothing.
	Resolved func(slot int, res Resolution) error
}

// DNSServer answers the runs' DNS queries: UDP to [GatewayAddr]:53 over
// any run's link. The run is told apart by the query's source, which the
// link's ingress rewrote to the run's own address (a forged one is
// dropped there).
type DNSServer struct {
	h    *Gateway
	cfg  DNSConfig
	conn *net.UDPConn
	wg   sync.WaitGroup
	mu   sync.Mutex
	busy map[int]int // slot → queries being answered
	sem  chan struct{}
	stop context.CancelFunc
	ctx  context.Context
}

// ServeDNS opens the resolver's socket in the host's namespace and serves
// until Close. The gateway address need not exist yet (no run linked):
// the socket binds it freely.
func (h *Gateway) ServeDNS(cfg DNSConfig) (*DNSServer, error) {
	if cfg.Resolver == nil || cfg.Run == nil || cfg.Resolved == nil {
		return nil, fmt.Errorf("%w: a resolver needs its Resolver, Run and Resolved", ErrInvalid)
	}
	var conn *net.UDPConn
	err := inNetns(h.ns, func() error {
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1) })
			return errors.Join(err, serr)
		}}
		pc, err := lc.ListenPacket(context.Background(), "udp4", netip.AddrPortFrom(GatewayAddr, DNSPort).String())
		if err != nil {
			return err
		}
		conn = pc.(*net.UDPConn)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("egress resolver: listen on %s:%d: %w", GatewayAddr, DNSPort, err)
	}
	if err := h.setResolving(true); err != nil {
		conn.Close()
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &DNSServer{h: h, cfg: cfg, conn: conn, busy: map[int]int{}, sem: make(chan struct{}, dnsInFlight), ctx: ctx, stop: stop}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Close stops the resolver, waits for the queries being answered, and
// lets no sandbox's packet reach the host's port 53 again.
func (s *DNSServer) Close() error {
	s.stop()
	err := s.conn.Close()
	s.wg.Wait()
	return errors.Join(err, s.h.setResolving(false))
}

// setResolving lets the sandboxes' queries reach the host's resolver
// port, or not.
func (h *Gateway) setResolving(on bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resolving = on
	if err := h.nft(func(c *nftables.Conn) error { h.hostTables(c); return nil }); err != nil {
		return fmt.Errorf("egress resolver: the input chain: %w", err)
	}
	return nil
}

func (s *DNSServer) serve() {
	defer s.wg.Done()
	buf := make([]byte, maxMessage+1)
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		slot, ok := s.slotOf(from.Addr().Unmap())
		if !ok || n > maxMessage || !s.take(slot) {
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.done(slot)
			if reply := s.answer(slot, q); reply != nil {
				s.conn.WriteToUDPAddrPort(reply, from)
			}
		}()
	}
}

// slotOf is the slot whose run's address a is.
func (s *DNSServer) slotOf(a netip.Addr) (int, bool) {
	if !a.Is4() || !s.h.pool.Contains(a) {
		return 0, false
	}
	slot := int(u32(a) - u32(s.h.pool.Addr()))
	return slot, slot >= 1 && slot <= s.h.Slots()
}

// take reserves a place for a query of slot's run, or says there is none.
func (s *DNSServer) take(slot int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy[slot] >= dnsInFlightPerRun {
		return false
	}
	select {
	case s.sem <- struct{}{}:
	default:
		return false
	}
	s.busy[slot]++
	return true
}

func (s *DNSServer) done(slot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	<-s.sem
	if s.busy[slot]--; s.busy[slot] == 0 {
		delete(s.busy, slot)
	}
}

// answer is the reply to q from slot's run: nil drops it.
func (s *DNSServer) answer(slot int, q []byte) []byte {
	r := s.cfg.Run(slot)
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, dnsQueryTime)
	defer cancel()
	reply, res := s.cfg.Resolver.Answer(ctx, q, r.Names())
	if res == nil {
		return reply
	}
	if err := s.cfg.Resolved(slot, *res); err != nil {
		return failure(q)
	}
	if len(res.Addrs) > 0 {
		if err := r.Allowed(res.Name, res.Addrs, res.TTL); err != nil {
			return failure(q)
		}
	}
	return reply
}

// failure is SERVFAIL for q, a query Answer read already.
func failure(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	question, err := p.Question()
	if err != nil {
		return nil
	}
	return (&Resolver{}).reply(h, &question, dnsmessage.RCodeServerFailure, nil)
}
