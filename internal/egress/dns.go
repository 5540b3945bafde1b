package egress

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The resolver's bounds (docs/unit.md, names in an egress grant).
const (
	// MinTTL and MaxTTL clamp the time an answer's addresses stay
	// allowed (and the TTL the unit is told).
	MinTTL = 5 * time.Second
	MaxTTL = time.Hour
	// MaxAnswerAddrs bounds the addresses an answer gives and allows.
	MaxAnswerAddrs = 8
	// maxCNAMEs bounds the aliases followed in an upstream's answer.
	maxCNAMEs = 8
	// maxMessage bounds a message read, the unit's or the upstream's.
	maxMessage = 4096
	// udpReply bounds a reply to the unit (no EDNS: plain DNS over UDP).
	udpReply = 512
)

// ErrUpstream is an upstream resolver that failed, or whose answer is
// refused (malformed, or not an answer to the question asked).
var ErrUpstream = errors.New("egress: upstream resolver")

// Exchanger sends a DNS query to the host's upstream resolver and returns
// its reply's bytes: hostile, like the unit's.
type Exchanger interface {
	Exchange(ctx context.Context, query []byte) ([]byte, error)
}

// Resolution is one answer the resolver gave a unit for a name its grant
// lists: the addresses it allowed, and for how long.
type Resolution struct {
	Name  string       // lower case, no trailing dot
	Addrs []netip.Addr // IPv4, within the ceiling; none is an empty answer
	TTL   time.Duration
}

// Resolver answers a sandbox's DNS queries for the names its grant lists
// (A: forwarded upstream; AAAA: empty) and refuses every other
// (REFUSED). Every byte of the unit's query and of the upstream's answer
// is checked: one question, class IN, names within bounds, and the
// upstream's records only for the name asked or an alias it gave for
// it. Addresses outside the ceiling are left out of the answer.
type Resolver struct {
	Upstream Exchanger
	Ceiling  []netip.Prefix
}

// Answer answers query for a run whose grant lists names (lower case, as
// [unit.Dest] holds them). reply is nil for a query that cannot be
// answered at all (no readable header, or a response); res is non-nil
// when names were resolved (the caller allows res.Addrs for res.TTL
// before it sends reply, and journals res).
func (r *Resolver) Answer(ctx context.Context, query []byte, names []string) (reply []byte, res *Resolution) {
	var p dnsmessage.Parser
	if len(query) > maxMessage {
		return nil, nil
	}
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, nil
	}
	q, qerr := p.Question()
	if qerr == nil {
		// Exactly one question.
		if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
			qerr = errors.New("more than one question")
		}
	}
	if h.OpCode != 0 || qerr != nil {
		return r.reply(h, nil, dnsmessage.RCodeFormatError, nil), nil
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	if q.Class != dnsmessage.ClassINET || !slices.Contains(names, name) {
		return r.reply(h, &q, dnsmessage.RCodeRefused, nil), nil
	}
	switch q.Type {
	case dnsmessage.TypeAAAA:
		return r.reply(h, &q, dnsmessage.RCodeSuccess, nil), nil
	case dnsmessage.TypeA:
	default:
		return r.reply(h, &q, dnsmessage.RCodeRefused, nil), nil
	}
	addrs, ttl, rcode, err := r.resolve(ctx, q.Name)
	if err != nil {
		return r.reply(h, &q, dnsmessage.RCodeServerFailure, nil), nil
	}
	if rcode != dnsmessage.RCodeSuccess {
		return r.reply(h, &q, rcode, nil), nil
	}
	var kept []netip.Addr
	for _, a := range addrs {
		if len(kept) < MaxAnswerAddrs && !slices.Contains(kept, a) &&
			slices.ContainsFunc(r.Ceiling, func(c netip.Prefix) bool { return c.Contains(a) }) {
			kept = append(kept, a)
		}
	}
	ttl = min(max(ttl, MinTTL), MaxTTL)
	res = &Resolution{Name: name, Addrs: kept, TTL: ttl}
	return r.reply(h, &q, dnsmessage.RCodeSuccess, res), res
}

// reply builds the unit's reply: its id and question, rcode, and res's
// addresses under the question's name.
func (r *Resolver) reply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, res *Resolution) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, udpReply), dnsmessage.Header{
		ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil
	}
	if q != nil {
		if err := b.Question(*q); err != nil {
			return nil
		}
	}
	if err := b.StartAnswers(); err != nil {
		return nil
	}
	if res != nil {
		for _, a := range res.Addrs {
			rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: uint32(res.TTL / time.Second)}
			if err := b.AResource(rh, dnsmessage.AResource{A: a.As4()}); err != nil {
				return nil
			}
		}
	}
	out, err := b.Finish()
	if err != nil || len(out) > udpReply {
		return nil
	}
	return out
}

// resolve asks the upstream for name's A records: the addresses of name,
// or of the end of the aliases the upstream gave for it, and the least
// TTL among the records used.
func (r *Resolver) resolve(ctx context.Context, name dnsmessage.Name) ([]netip.Addr, time.Duration, dnsmessage.RCode, error) {
	var idb [2]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, 0, 0, err
	}
	id := binary.BigEndian.Uint16(idb[:])
	q := dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return nil, 0, 0, err
	}
	if err := b.Question(q); err != nil {
		return nil, 0, 0, err
	}
	query, err := b.Finish()
	if err != nil {
		return nil, 0, 0, err
	}
	ans, err := r.Upstream.Exchange(ctx, query)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%w: %w", ErrUpstream, err)
	}
	return readAnswer(ans, id, q)
}

// readAnswer reads an upstream's answer to question q sent with id.
func readAnswer(ans []byte, id uint16, q dnsmessage.Question) ([]netip.Addr, time.Duration, dnsmessage.RCode, error) {
	bad := func(why string) ([]netip.Addr, time.Duration, dnsmessage.RCode, error) {
		return nil, 0, 0, fmt.Errorf("%w: %s", ErrUpstream, why)
	}
	if len(ans) > maxMessage {
		return bad("answer too long")
	}
	var p dnsmessage.Parser
	h, err := p.Start(ans)
	if err != nil {
		return bad("header: " + err.Error())
	}
	if h.ID != id || !h.Response || h.OpCode != 0 {
		return bad("not an answer to the query sent")
	}
	if h.Truncated {
		return bad("answer truncated")
	}
	aq, err := p.Question()
	if err != nil || !sameName(aq.Name, q.Name) || aq.Type != q.Type || aq.Class != q.Class {
		return bad("answer to another question")
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		return bad("more than one question")
	}
	if h.RCode != dnsmessage.RCodeSuccess {
		if h.RCode == dnsmessage.RCodeNameError {
			return nil, 0, h.RCode, nil
		}
		return bad("rcode " + h.RCode.String())
	}
	want := q.Name // the name whose records are used: q's, then its aliases
	var addrs []netip.Addr
	var ttl time.Duration = MaxTTL
	aliases := 0
	for {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return bad("answer: " + err.Error())
		}
		if rh.Class != dnsmessage.ClassINET || !sameName(rh.Name, want) {
			if err := p.SkipAnswer(); err != nil {
				return bad("answer: " + err.Error())
			}
			continue
		}
		switch rh.Type {
		case dnsmessage.TypeA:
			a, err := p.AResource()
			if err != nil {
				return bad("A record: " + err.Error())
			}
			addrs = append(addrs, netip.AddrFrom4(a.A))
		case dnsmessage.TypeCNAME:
			c, err := p.CNAMEResource()
			if err != nil {
				return bad("CNAME record: " + err.Error())
			}
			if aliases++; aliases > maxCNAMEs || len(addrs) > 0 {
				return bad("aliases too many, or after addresses")
			}
			want = c.CNAME
		default:
			if err := p.SkipAnswer(); err != nil {
				return bad("answer: " + err.Error())
			}
			continue
		}
		ttl = min(ttl, time.Duration(rh.TTL)*time.Second)
	}
	return addrs, ttl, dnsmessage.RCodeSuccess, nil
}

// sameName is a and b equal as DNS names (ASCII case folded).
func sameName(a, b dnsmessage.Name) bool {
	return strings.EqualFold(a.String(), b.String())
}

// UDPUpstream is a resolver reached over UDP at its address, each
// exchange on a socket of its own (a port of its own), made in the
// caller's network namespace or, from [Gateway.Upstream], the host's.
type UDPUpstream struct {
	Addr    netip.AddrPort
	Timeout time.Duration // 2 s when zero
	h       *Gateway
}

// Upstream is the resolver at addr, reached from the host's namespace.
func (h *Gateway) Upstream(addr netip.AddrPort) UDPUpstream {
	return UDPUpstream{Addr: addr, h: h}
}

// Exchange sends query and returns the first datagram back from the
// upstream's address.
func (u UDPUpstream) Exchange(ctx context.Context, query []byte) ([]byte, error) {
	timeout := u.Timeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	var c net.Conn
	dial := func() (err error) { c, err = d.DialContext(ctx, "udp4", u.Addr.String()); return err }
	var err error
	if u.h != nil {
		err = inNetns(u.h.ns, dial)
	} else {
		err = dial()
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			return nil, err
		}
	}
	if _, err := c.Write(query); err != nil {
		return nil, err
	}
	buf := make([]byte, maxMessage+1)
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}
