package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Reset says why a restored run's TCP connections to outside are closed
// when the outside's packets pass to it ([Run.Restore], [Run.Pass]).
type Reset uint8

const (
	// Keep: the host kept the run's tracked connections and their
	// translation since its park; its connections go on.
	Keep Reset = 0
	// Elsewhere: the run's connections have no state on this host: it
	// was parked on another host, or left this one and came back, or
	// its rules were gone at the restore (this host restarted).
	Elsewhere Reset = 1
	// Expired: the run stayed parked here past the hold, and its
	// tracked connections were removed ([Gateway.Forget]).
	Expired Reset = 2
)

// Conn is a TCP connection of a sandbox, by its IPv4 ends: its own
// address and port, and the remote's.
type Conn struct {
	Local, Remote netip.AddrPort
}

// Closed is what a Pass closed: why, and the connections, in ascending
// order of their local then remote ends.
type Closed struct {
	Why   Reset
	Conns []Conn
}

// The TCP states (include/net/tcp_states.h) a restore brings a connected
// socket back in: these are closed. A connect still in progress
// (SYN_SENT) is left to try again over the new link; a listener and a
// TIME_WAIT hold no connection to lose.
var resetStates = []uint8{
	1,  // ESTABLISHED
	4,  // FIN_WAIT1
	5,  // FIN_WAIT2
	8,  // CLOSE_WAIT
	9,  // LAST_ACK
	11, // CLOSING
}

// The sizes of inet_diag_req_v2 and inet_diag_msg (linux/inet_diag.h).
const (
	diagReqSize = 56
	diagMsgSize = 72
)

// diagID is an inet_diag_sockid as the kernel gives it: ports and
// addresses big-endian, the rest host order, copied back as they came.
type diagID [48]byte

// diagReq is an inet_diag_req_v2.
type diagReq struct {
	family byte
	states uint32
	id     diagID
}

func (r diagReq) Serialize() []byte {
	b := make([]byte, diagReqSize)
	b[0], b[1] = r.family, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(b[4:], r.states)
	copy(b[8:], r.id[:])
	return b
}

func (r diagReq) Len() int { return diagReqSize }

// diagSock is one socket a dump listed.
type diagSock struct {
	family byte
	state  byte
	id     diagID
}

// ends are the socket's IPv4 ends; false for an IPv6 socket whose ends
// are not IPv4-mapped.
func (s diagSock) ends() (Conn, bool) {
	port := func(off int) uint16 { return binary.BigEndian.Uint16(s.id[off:]) }
	addr := func(off int) (netip.Addr, bool) {
		if s.family == unix.AF_INET {
			return netip.AddrFrom4([4]byte(s.id[off : off+4])), true
		}
		a := netip.AddrFrom16([16]byte(s.id[off : off+16]))
		return a.Unmap(), a.Is4In6()
	}
	l, ok1 := addr(4)
	r, ok2 := addr(20)
	return Conn{Local: netip.AddrPortFrom(l, port(0)), Remote: netip.AddrPortFrom(r, port(2))}, ok1 && ok2
}

// toOutside says whether a sandbox's connection to remote leaves the
// sandbox: not to loopback, not to its own address, not unconnected.
func toOutside(remote netip.Addr) bool {
	return !remote.IsLoopback() && !remote.IsUnspecified() && remote != SandboxAddr
}

// inetDiag opens a NETLINK_SOCK_DIAG socket in namespace ns: the sockets
// it lists and destroys are that namespace's.
func inetDiag(ns netns.NsHandle) (*nl.NetlinkSocket, error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_INET_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag in the sandbox: %w", err)
	}
	tv := unix.Timeval{Sec: 5}
	if err := errors.Join(s.SetSendTimeout(&tv), s.SetReceiveTimeout(&tv)); err != nil {
		s.Close()
		return nil, fmt.Errorf("sock_diag in the sandbox: %w", err)
	}
	return s, nil
}

func diagRequest(s *nl.NetlinkSocket, typ, flags int, data diagReq) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(typ, flags)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_INET_DIAG: {Socket: s}}
	req.AddData(data)
	return req
}

// tcpSockets lists the TCP sockets of family in states (a bit per
// state) of the namespace s is in.
func tcpSockets(s *nl.NetlinkSocket, family byte, states uint32) ([]diagSock, error) {
	var out []diagSock
	var bad error
	req := diagRequest(s, nl.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP, diagReq{family: family, states: states})
	err := req.ExecuteIter(unix.NETLINK_INET_DIAG, nl.SOCK_DIAG_BY_FAMILY, func(m []byte) bool {
		if len(m) < diagMsgSize {
			bad = fmt.Errorf("sock_diag: a socket of %d bytes", len(m))
			return false
		}
		out = append(out, diagSock{family: m[0], state: m[1], id: diagID(m[4:52])})
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("sock_diag: list TCP sockets: %w", err)
	}
	return out, bad
}

// outsideSockets lists the TCP sockets of the sandbox whose network
// namespace s is in that hold a connection to outside in a state of
// resetStates, with their ends, in ascending order of their local then
// remote ends. Listeners and connections over loopback or to the
// sandbox's own address are not listed.
func outsideSockets(s *nl.NetlinkSocket) ([]diagSock, []Conn, error) {
	var states uint32
	for _, st := range resetStates {
		states |= 1 << st
	}
	var socks []diagSock
	var conns []Conn
	for _, fam := range []byte{unix.AF_INET, unix.AF_INET6} {
		got, err := tcpSockets(s, fam, states)
		if errors.Is(err, nl.ErrDumpInterrupted) { // the list changed as it was read: once more
			got, err = tcpSockets(s, fam, states)
		}
		if err != nil {
			return nil, nil, err
		}
		for _, sk := range got {
			c, ok := sk.ends()
			if ok && toOutside(c.Remote.Addr()) && slices.Contains(resetStates, sk.state) {
				socks, conns = append(socks, sk), append(conns, c)
			}
		}
	}
	idx := make([]int, len(conns))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return compareConns(conns[a], conns[b]) })
	ss, cs := make([]diagSock, len(idx)), make([]Conn, len(idx))
	for i, j := range idx {
		ss[i], cs[i] = socks[j], conns[j]
	}
	return ss, cs, nil
}

func compareConns(a, b Conn) int {
	if c := a.Local.Compare(b.Local); c != 0 {
		return c
	}
	return a.Remote.Compare(b.Remote)
}

// listOutside lists the TCP connections to outside that resetOutside
// would close in the sandbox whose network namespace is ns
// (outsideSockets).
func listOutside(ns netns.NsHandle) ([]Conn, error) {
	s, err := inetDiag(ns)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	_, conns, err := outsideSockets(s)
	return conns, err
}

// resetOutside closes every TCP connection to outside of the sandbox
// whose network namespace is ns (outsideSockets): each is aborted
// (SOCK_DESTROY: its owner's next call fails with ECONNABORTED, a reader
// blocked on it wakes with that error). It returns the connections
// closed; one already gone when destroyed is not an error, and not
// listed.
func resetOutside(ns netns.NsHandle) ([]Conn, error) {
	s, err := inetDiag(ns)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	socks, conns, err := outsideSockets(s)
	if err != nil {
		return nil, err
	}
	var out []Conn
	var errs []error
	for i, sk := range socks {
		c := conns[i]
		// The socket by its exact id, cookie included: this one, not
		// one that took its ends since.
		req := diagRequest(s, nl.SOCK_DESTROY, unix.NLM_F_ACK, diagReq{family: sk.family, states: 1 << sk.state, id: sk.id})
		_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
		switch {
		case errors.Is(err, unix.ENOENT):
		case err != nil:
			errs = append(errs, fmt.Errorf("sock_diag: destroy %s-%s: %w", c.Local, c.Remote, err))
		default:
			out = append(out, c)
		}
	}
	return out, errors.Join(errs...)
}
