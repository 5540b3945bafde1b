package peer

import (
	"net"
	"testing"
)

// addrConn is a net.Conn that only has a remote address.
type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// The per-source count groups an IPv6 source by its /64 (one host is
// commonly given a whole /64, so an address of its own per connection
// costs it nothing), an IPv4 source (and an IPv4-mapped IPv6 one) by its
// address.
func TestSourceOf(t *testing.T) {
	src := func(ip string) string {
		return sourceOf(addrConn{remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 4000}})
	}
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:fffe", true},
		{"2001:db8:1:2::1", "2001:db8:1:3::1", false},
		{"fe80::1", "fe80::2", true},
		{"::1", "::1", true},
		{"192.0.2.1", "192.0.2.1", true},
		{"192.0.2.1", "192.0.2.2", false},
		{"::ffff:192.0.2.1", "192.0.2.1", true},
		{"::ffff:192.0.2.1", "::ffff:192.0.2.2", false},
	} {
		if got := src(c.a) == src(c.b); got != c.same {
			t.Errorf("%s (%s) and %s (%s): one source %v, want %v", c.a, src(c.a), c.b, src(c.b), got, c.same)
		}
	}
}
