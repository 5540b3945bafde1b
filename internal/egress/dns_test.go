package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// upstreamFunc is an upstream resolver made of a function of the query.
type upstreamFunc func(q []byte) ([]byte, error)

func (f upstreamFunc) Exchange(_ context.Context, q []byte) ([]byte, error) { return f(q) }

// rr is an answer record an upstream gives: an A record when a is valid,
// else a CNAME to cname.
type rr struct {
	name  string
	a     netip.Addr
	cname string
	ttl   uint32
}

// answering is an upstream that answers every query with records, after
// edit may change the header and question it answers.
func answering(t testing.TB, edit func(*dnsmessage.Header, *dnsmessage.Question), records ...rr) upstreamFunc {
	return func(query []byte) ([]byte, error) {
		var p dnsmessage.Parser
		h, err := p.Start(query)
		if err != nil {
			t.Errorf("upstream: query: %v", err)
			return nil, err
		}
		q, err := p.Question()
		if err != nil {
			t.Errorf("upstream: question: %v", err)
			return nil, err
		}
		h.Response = true
		if edit != nil {
			edit(&h, &q)
		}
		b := dnsmessage.NewBuilder(nil, h)
		b.EnableCompression()
		must(t, b.StartQuestions())
		must(t, b.Question(q))
		must(t, b.StartAnswers())
		for _, r := range records {
			rh := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(r.name), Class: dnsmessage.ClassINET, TTL: r.ttl}
			if r.a.IsValid() {
				must(t, b.AResource(rh, dnsmessage.AResource{A: r.a.As4()}))
			} else {
				must(t, b.CNAMEResource(rh, dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(r.cname)}))
			}
		}
		return b.Finish()
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// query is a unit's query for name of type typ.
func query(t testing.TB, id uint16, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	must(t, b.StartQuestions())
	must(t, b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}))
	out, err := b.Finish()
	must(t, err)
	return out
}

// reply reads a reply: its rcode, addresses and TTLs, checking its id.
func readReply(t *testing.T, b []byte, id uint16) (dnsmessage.RCode, []netip.Addr, []uint32) {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		t.Fatalf("reply: %v", err)
	}
	if m.ID != id || !m.Response {
		t.Fatalf("reply: id %d response %v, want id %d and a response", m.ID, m.Response, id)
	}
	var addrs []netip.Addr
	var ttls []uint32
	for _, a := range m.Answers {
		r, ok := a.Body.(*dnsmessage.AResource)
		if !ok {
			t.Fatalf("reply: a %T record", a.Body)
		}
		addrs = append(addrs, netip.AddrFrom4(r.A))
		ttls = append(ttls, a.Header.TTL)
	}
	return m.RCode, addrs, ttls
}

var (
	farAddr  = netip.MustParseAddr("198.51.100.7")
	farAddr2 = netip.MustParseAddr("198.51.100.8")
	outside  = netip.MustParseAddr("203.0.113.9")
	ceiling  = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	granted  = []string{"pypi.org", "files.example.net"}
)

func TestResolverAnswers(t *testing.T) {
	asked := 0
	up := answering(t, nil, rr{name: "pypi.org.", a: farAddr, ttl: 60}, rr{name: "pypi.org.", a: outside, ttl: 60},
		rr{name: "pypi.org.", a: farAddr2, ttl: 30})
	r := &Resolver{Upstream: upstreamFunc(func(q []byte) ([]byte, error) { asked++; return up(q) }), Ceiling: ceiling}
	for _, c := range []struct {
		name   string
		typ    dnsmessage.Type
		rcode  dnsmessage.RCode
		addrs  []netip.Addr
		asked  int
		record bool
	}{
		{"pypi.org.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []netip.Addr{farAddr, farAddr2}, 1, true},
		{"PyPI.ORG.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []netip.Addr{farAddr, farAddr2}, 1, true},
		{"pypi.org.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, nil, 0, false},
		{"pypi.org.", dnsmessage.TypeMX, dnsmessage.RCodeRefused, nil, 0, false},
		{"example.org.", dnsmessage.TypeA, dnsmessage.RCodeRefused, nil, 0, false},
		{"example.org.", dnsmessage.TypeAAAA, dnsmessage.RCodeRefused, nil, 0, false},
		{"www.pypi.org.", dnsmessage.TypeA, dnsmessage.RCodeRefused, nil, 0, false}, // exact names only
		{"org.", dnsmessage.TypeA, dnsmessage.RCodeRefused, nil, 0, false},
	} {
		asked = 0
		reply, res := r.Answer(context.Background(), query(t, 4242, c.name, c.typ), granted)
		rcode, addrs, ttls := readReply(t, reply, 4242)
		if rcode != c.rcode || !slices.Equal(addrs, c.addrs) || asked != c.asked || (res != nil) != c.record {
			t.Errorf("%s %s: %s %v, upstream asked %d, resolution %v; want %s %v, %d, %v",
				c.name, c.typ, rcode, addrs, asked, res, c.rcode, c.addrs, c.asked, c.record)
		}
		for _, ttl := range ttls {
			if ttl != 30 {
				t.Errorf("%s: TTL %d, want the least, 30", c.name, ttl)
			}
		}
		if res != nil && (res.Name != "pypi.org" || res.TTL != 30*time.Second || !slices.Equal(res.Addrs, c.addrs)) {
			t.Errorf("%s: resolution %+v", c.name, res)
		}
	}
}

func TestResolverTTLClamped(t *testing.T) {
	for _, c := range []struct {
		ttl  uint32
		want time.Duration
	}{{0, MinTTL}, {1, MinTTL}, {5, 5 * time.Second}, {3600, time.Hour}, {1 << 31, MaxTTL}} {
		r := &Resolver{Upstream: answering(t, nil, rr{name: "pypi.org.", a: farAddr, ttl: c.ttl}), Ceiling: ceiling}
		reply, res := r.Answer(context.Background(), query(t, 1, "pypi.org.", dnsmessage.TypeA), granted)
		_, _, ttls := readReply(t, reply, 1)
		if res == nil || res.TTL != c.want || len(ttls) != 1 || ttls[0] != uint32(c.want/time.Second) {
			t.Errorf("TTL %d: resolution %+v, reply TTLs %v; want %s", c.ttl, res, ttls, c.want)
		}
	}
}

func TestResolverAliasesAndStrays(t *testing.T) {
	r := &Resolver{Upstream: answering(t, nil,
		rr{name: "other.example.", a: farAddr2, ttl: 60}, // not asked for: ignored
		rr{name: "pypi.org.", cname: "cdn.example.", ttl: 20},
		rr{name: "cdn.example.", a: farAddr, ttl: 600},
	), Ceiling: ceiling}
	reply, res := r.Answer(context.Background(), query(t, 7, "pypi.org.", dnsmessage.TypeA), granted)
	rcode, addrs, ttls := readReply(t, reply, 7)
	if rcode != dnsmessage.RCodeSuccess || !slices.Equal(addrs, []netip.Addr{farAddr}) || ttls[0] != 20 || res == nil || res.TTL != 20*time.Second {
		t.Errorf("got %s %v %v %+v; want %s under the asked name, TTL 20", rcode, addrs, ttls, res, farAddr)
	}
}

func TestResolverCeilingLeavesNothing(t *testing.T) {
	r := &Resolver{Upstream: answering(t, nil, rr{name: "pypi.org.", a: outside, ttl: 60}), Ceiling: ceiling}
	reply, res := r.Answer(context.Background(), query(t, 7, "pypi.org.", dnsmessage.TypeA), granted)
	rcode, addrs, _ := readReply(t, reply, 7)
	if rcode != dnsmessage.RCodeSuccess || len(addrs) != 0 || res == nil || len(res.Addrs) != 0 {
		t.Errorf("got %s %v %+v; want an empty answer, journaled", rcode, addrs, res)
	}
}

func TestResolverHostileUpstream(t *testing.T) {
	loops := func(chain int) []rr {
		var rs []rr
		for i := range chain {
			from := "pypi.org."
			if i > 0 {
				from = string(rune('a'+i-1)) + ".example."
			}
			rs = append(rs, rr{name: from, cname: string(rune('a'+i)) + ".example.", ttl: 60})
		}
		return rs
	}
	ok := answering(t, nil, rr{name: "pypi.org.", a: farAddr, ttl: 60})
	for _, c := range []struct {
		what  string
		up    Exchanger
		rcode dnsmessage.RCode
	}{
		{"an error", upstreamFunc(func([]byte) ([]byte, error) { return nil, errors.New("timeout") }), dnsmessage.RCodeServerFailure},
		{"another id", answering(t, func(h *dnsmessage.Header, _ *dnsmessage.Question) { h.ID++ }, rr{name: "pypi.org.", a: farAddr}), dnsmessage.RCodeServerFailure},
		{"not a response", answering(t, func(h *dnsmessage.Header, _ *dnsmessage.Question) { h.Response = false }), dnsmessage.RCodeServerFailure},
		{"another question", answering(t, func(_ *dnsmessage.Header, q *dnsmessage.Question) { q.Name = dnsmessage.MustNewName("evil.example.") }, rr{name: "evil.example.", a: farAddr}), dnsmessage.RCodeServerFailure},
		{"truncated", answering(t, func(h *dnsmessage.Header, _ *dnsmessage.Question) { h.Truncated = true }, rr{name: "pypi.org.", a: farAddr}), dnsmessage.RCodeServerFailure},
		{"SERVFAIL", answering(t, func(h *dnsmessage.Header, _ *dnsmessage.Question) { h.RCode = dnsmessage.RCodeServerFailure }), dnsmessage.RCodeServerFailure},
		{"NXDOMAIN", answering(t, func(h *dnsmessage.Header, _ *dnsmessage.Question) { h.RCode = dnsmessage.RCodeNameError }), dnsmessage.RCodeNameError},
		{"aliases too many", answering(t, nil, loops(maxCNAMEs+1)...), dnsmessage.RCodeServerFailure},
		{"cut short", upstreamFunc(func(q []byte) ([]byte, error) { b, err := ok(q); return b[:len(b)-2], err }), dnsmessage.RCodeServerFailure},
		{"too long", upstreamFunc(func(q []byte) ([]byte, error) { b, err := ok(q); return append(b, make([]byte, maxMessage)...), err }), dnsmessage.RCodeServerFailure},
		{"a compression loop", upstreamFunc(func(q []byte) ([]byte, error) {
			b, err := ok(q)
			// The answer's name: a pointer to itself.
			i := len(q)
			b[i], b[i+1] = 0xc0|byte(i>>8), byte(i)
			return b, err
		}), dnsmessage.RCodeServerFailure},
	} {
		r := &Resolver{Upstream: c.up, Ceiling: ceiling}
		reply, res := r.Answer(context.Background(), query(t, 9, "pypi.org.", dnsmessage.TypeA), granted)
		rcode, addrs, _ := readReply(t, reply, 9)
		if rcode != c.rcode || len(addrs) != 0 || res != nil {
			t.Errorf("upstream gives %s: %s %v %+v; want %s, nothing allowed", c.what, rcode, addrs, res, c.rcode)
		}
	}
}

func TestResolverHostileQuery(t *testing.T) {
	r := &Resolver{Upstream: upstreamFunc(func([]byte) ([]byte, error) {
		t.Error("upstream asked")
		return nil, errors.New("no")
	}), Ceiling: ceiling}
	two := func() []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 5})
		must(t, b.StartQuestions())
		for _, n := range []string{"pypi.org.", "files.example.net."} {
			must(t, b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(n), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}))
		}
		out, err := b.Finish()
		must(t, err)
		return out
	}
	loop := query(t, 5, "pypi.org.", dnsmessage.TypeA)
	loop[12], loop[13] = 0xc0, 12 // the question's name points at itself
	chaos := query(t, 5, "pypi.org.", dnsmessage.TypeA)
	chaos[len(chaos)-1] = 3 // class CH
	opcode := query(t, 5, "pypi.org.", dnsmessage.TypeA)
	opcode[2] |= 2 << 3 // a status request
	response := query(t, 5, "pypi.org.", dnsmessage.TypeA)
	response[2] |= 0x80
	for _, c := range []struct {
		what  string
		q     []byte
		rcode dnsmessage.RCode
		none  bool // no reply
	}{
		{"nothing", nil, 0, true},
		{"a short header", []byte{0, 5, 1}, 0, true},
		{"a response", response, 0, true},
		{"too long", append(query(t, 5, "pypi.org.", dnsmessage.TypeA), make([]byte, maxMessage)...), 0, true},
		{"two questions", two(), dnsmessage.RCodeFormatError, false},
		{"no question", query(t, 5, "pypi.org.", dnsmessage.TypeA)[:12], dnsmessage.RCodeFormatError, false},
		{"a compression loop", loop, dnsmessage.RCodeFormatError, false},
		{"another opcode", opcode, dnsmessage.RCodeFormatError, false},
		{"class CH", chaos, dnsmessage.RCodeRefused, false},
	} {
		reply, res := r.Answer(context.Background(), c.q, granted)
		if res != nil {
			t.Errorf("%s: resolved %+v", c.what, res)
		}
		if c.none {
			if reply != nil {
				t.Errorf("%s: replied", c.what)
			}
			continue
		}
		if reply == nil {
			t.Errorf("%s: no reply, want %s", c.what, c.rcode)
			continue
		}
		if rcode, addrs, _ := readReply(t, reply, 5); rcode != c.rcode || len(addrs) != 0 {
			t.Errorf("%s: %s %v, want %s", c.what, rcode, addrs, c.rcode)
		}
	}
}

func TestResolverAnswerBounded(t *testing.T) {
	long := "a234567890123456789012345678901234567890123456789012345678901.b234567890123456789012345678901234567890123456789012345678901.c234567890123456789012345678901234567890123456789012345678901.d234567890123456789012345678901234567890123456789012345678.example"
	var many []rr
	for i := range 40 {
		many = append(many, rr{name: long + ".", a: netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), ttl: 60})
	}
	r := &Resolver{Upstream: answering(t, nil, many...), Ceiling: ceiling}
	reply, res := r.Answer(context.Background(), query(t, 3, long+".", dnsmessage.TypeA), []string{long})
	if len(reply) > udpReply {
		t.Fatalf("reply of %d bytes", len(reply))
	}
	_, addrs, _ := readReply(t, reply, 3)
	if len(addrs) != MaxAnswerAddrs || res == nil || len(res.Addrs) != MaxAnswerAddrs {
		t.Errorf("%d addresses answered, %+v allowed; want %d", len(addrs), res, MaxAnswerAddrs)
	}
}

func TestUDPUpstream(t *testing.T) {
	srv, err := net.ListenPacket("udp4", "127.0.0.1:0")
	must(t, err)
	defer srv.Close()
	up := answering(t, nil, rr{name: "pypi.org.", a: farAddr, ttl: 60})
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			if b, err := up(buf[:n]); err == nil {
				srv.WriteTo(b, from)
			}
		}
	}()
	r := &Resolver{Upstream: UDPUpstream{Addr: netip.MustParseAddrPort(srv.LocalAddr().String())}, Ceiling: ceiling}
	reply, res := r.Answer(context.Background(), query(t, 11, "pypi.org.", dnsmessage.TypeA), granted)
	if rcode, addrs, _ := readReply(t, reply, 11); rcode != dnsmessage.RCodeSuccess || !slices.Equal(addrs, []netip.Addr{farAddr}) || res == nil {
		t.Errorf("over UDP: %s %v %+v", rcode, addrs, res)
	}
	// An upstream that never answers: SERVFAIL within the timeout.
	quiet, err := net.ListenPacket("udp4", "127.0.0.1:0")
	must(t, err)
	defer quiet.Close()
	r.Upstream = UDPUpstream{Addr: netip.MustParseAddrPort(quiet.LocalAddr().String()), Timeout: 100 * time.Millisecond}
	start := time.Now()
	reply, res = r.Answer(context.Background(), query(t, 12, "pypi.org.", dnsmessage.TypeA), granted)
	if rcode, _, _ := readReply(t, reply, 12); rcode != dnsmessage.RCodeServerFailure || res != nil || time.Since(start) > 2*time.Second {
		t.Errorf("a quiet upstream: %s %+v after %s", rcode, res, time.Since(start))
	}
}

// Whatever the unit's query and the upstream's answer, the resolver does
// not fail, its reply fits plain DNS over UDP, and what it allows is for
// a granted name, within the ceiling, at most MaxAnswerAddrs, for a TTL
// within bounds.
func FuzzResolverAnswer(f *testing.F) {
	ok := func(q []byte) []byte {
		b, err := answering(f, nil, rr{name: "pypi.org.", cname: "x.example.", ttl: 9}, rr{name: "x.example.", a: farAddr, ttl: 60})(q)
		must(f, err)
		return b
	}
	q := query(f, 1, "pypi.org.", dnsmessage.TypeA)
	f.Add(q, ok(q))
	f.Add(query(f, 2, "PYPI.org.", dnsmessage.TypeAAAA), []byte{})
	f.Add(q[:20], q)
	f.Fuzz(func(t *testing.T, q, ans []byte) {
		r := &Resolver{Ceiling: ceiling, Upstream: upstreamFunc(func(sent []byte) ([]byte, error) {
			// The answer's id made the query's, so the fuzzer reaches
			// past the id check.
			if len(ans) >= 2 && len(sent) >= 2 {
				ans = append([]byte{sent[0], sent[1]}, ans[2:]...)
			}
			return ans, nil
		})}
		reply, res := r.Answer(context.Background(), q, granted)
		if len(reply) > udpReply {
			t.Fatalf("a reply of %d bytes", len(reply))
		}
		if res == nil {
			return
		}
		if !slices.Contains(granted, res.Name) || len(res.Addrs) > MaxAnswerAddrs || res.TTL < MinTTL || res.TTL > MaxTTL {
			t.Fatalf("allowed %+v", res)
		}
		for _, a := range res.Addrs {
			if !ceiling[0].Contains(a) {
				t.Fatalf("allowed %s, outside the ceiling", a)
			}
		}
	})
}
