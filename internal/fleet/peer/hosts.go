package peer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The peer routes' bodies (internal/server serves the routes).

// MaxOfferImages bounds the image names one placement request asks about.
const MaxOfferImages = 1024

// maxAnswer bounds a peer route's JSON answer, as the server bounds a
// JSON body.
const maxAnswer = 1 << 20

// OfferRequest and OfferAnswer are POST /v1/placement's body and answer.
type OfferRequest struct {
	Images []string `json:"images"`
}

// OfferAnswer is a host's drain.Offer on the wire.
type OfferAnswer struct {
	Facts      map[string]string `json:"facts"`
	Images     map[string]string `json:"images"`
	Free       uint64            `json:"free"`
	Draining   bool              `json:"draining"`
	ImageParks bool              `json:"image_parks"`
	// EgressAllow and EgressNames are the host's egress ceiling: IPv4
	// prefixes, none granting no egress.
	EgressAllow []string `json:"egress_allow,omitempty"`
	EgressNames bool     `json:"egress_names,omitempty"`
	// PostCopy: the host takes a parked run post-copy; only then does a
	// source send Migration.Held.
	PostCopy bool `json:"post_copy,omitempty"`
}

// Migration is POST /v1/migrations's body: the run, whether to resume
// it (it was executing on the host handing it over), and whether the
// source holds it for a post-copy target (member.Handed.Held; sent only
// to a host whose offer has PostCopy, absent it is fetched from whole).
type Migration struct {
	Run     string         `json:"run"`
	Genesis record.Address `json:"genesis"`
	Head    record.Address `json:"head"`
	Resume  bool           `json:"resume"`
	Held    bool           `json:"held,omitempty"`
}

// Handed is POST /v1/migrations's answer: the run as held on the target
// (api.Run), and whether the target owes slabs of it, fetched after the
// answer (a post-copy migration): the source then serves the run until
// the target's POST /v1/migrations/done.
type Handed struct {
	Run   api.Run `json:"run"`
	Owing bool    `json:"owing,omitempty"`
}

// Expected is POST /v1/migrations/expect's body: the source of a
// migration about to hand run Genesis to the host it asks.
type Expected struct {
	Genesis record.Address `json:"genesis"`
}

// Expect tells host that run genesis is about to be handed to it (POST
// /v1/migrations/expect): a host that held the run rehashes its objects
// while this one parks it.
func (p Hosts) Expect(ctx context.Context, host, genesis record.Address) error {
	_, err := p.post(ctx, host, "/v1/migrations/expect", Expected{Genesis: genesis})
	return err
}

// Done is POST /v1/migrations/done's body: the target of a post-copy
// migration holds every object of the run, or needs none (it closed the
// run): its id on the source, its genesis, the head it was handed over
// at.
type Done struct {
	Run     string         `json:"run"`
	Genesis record.Address `json:"genesis"`
	Head    record.Address `json:"head"`
}

// Held is POST /v1/migrations/held's body: a post-copy target asks the
// source whether it still holds the run for it — its id on the source,
// its genesis, the head it was handed over at. HeldAnswer is the answer:
// true only for the hold's own target at that head and genesis.
type Held struct {
	Run     string         `json:"run"`
	Genesis record.Address `json:"genesis"`
	Head    record.Address `json:"head"`
}

// HeldAnswer is POST /v1/migrations/held's answer.
type HeldAnswer struct {
	Held bool `json:"held"`
}

// Hosts reach the fleet's other hosts at the address their session gives,
// over mutual TLS pinned to their key: the client of the peer routes
// (cmd/runrecordd wires it as member.Peers).
type Hosts struct {
	Dir *fleet.Dir
	Key ed25519.PrivateKey // this host's
	// Reuse, when set, keeps each peer's connections open between calls,
	// so the runs of a drain share TLS sessions instead of a handshake
	// per call. Every call still reads the peer's membership first.
	Reuse *Reuse
}

// Reuse holds one transport per peer key and address: at most
// reuseIdle idle connections each, closed after reuseIdleFor unused.
type Reuse struct {
	mu   sync.Mutex
	byTo map[reuseKey]*http.Transport
}

type reuseKey struct {
	host record.Address
	addr string
}

const (
	reuseIdle    = 4
	reuseIdleFor = 30 * time.Second
)

// NewReuse is an empty Reuse.
func NewReuse() *Reuse { return &Reuse{byTo: map[reuseKey]*http.Transport{}} }

// Close closes every idle connection Reuse holds.
func (r *Reuse) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, tr := range r.byTo {
		tr.CloseIdleConnections()
	}
}

// RemoteError is another host's refusal, as its API said it.
type RemoteError struct {
	Host   record.Address
	Answer api.Error
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("host %s: %s (%s)", e.Host, e.Answer.Message, e.Answer.Code)
}

// client is an HTTP client to host's peer listener and its base URL, for
// one call; the caller calls done after it (without Reuse, done closes the
// client's connections: a peer listener holds 64 connections from one
// address, docs/fleet.md).
func (p Hosts) client(ctx context.Context, host record.Address) (c *http.Client, base string, done func(), _ error) {
	m, err := p.Dir.Member(ctx, host)
	if err != nil {
		return nil, "", nil, err
	}
	if m.Role != fleet.RoleHost || m.Peer == "" {
		return nil, "", nil, fmt.Errorf("host %s: %w: no live session serving the fleet", host, fleet.ErrNotAdmitted)
	}
	base = "https://" + m.Peer
	if p.Reuse == nil {
		tr := p.transport(host)
		return &http.Client{Transport: tr}, base, tr.CloseIdleConnections, nil
	}
	k := reuseKey{host, m.Peer}
	p.Reuse.mu.Lock()
	defer p.Reuse.mu.Unlock()
	tr := p.Reuse.byTo[k]
	if tr == nil {
		tr = p.transport(host)
		tr.MaxIdleConnsPerHost, tr.IdleConnTimeout = reuseIdle, reuseIdleFor
		p.Reuse.byTo[k] = tr
	}
	return &http.Client{Transport: tr}, base, func() {}, nil
}

// transport dials host's peer listener over mutual TLS pinned to its key.
func (p Hosts) transport(host record.Address) *http.Transport {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	return &http.Transport{TLSClientConfig: ClientConfig(p.Key, host), DialContext: dialer.DialContext,
		TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: 10 * time.Minute}
}

// Hand asks host to take the run m names (POST /v1/migrations), and
// says whether host owes slabs of it (Handed.Owing).
func (p Hosts) Hand(ctx context.Context, host record.Address, m Migration) (owing bool, _ error) {
	b, err := p.post(ctx, host, "/v1/migrations", m)
	if err != nil {
		return false, err
	}
	var a Handed
	if err := json.Unmarshal(b, &a); err != nil {
		return false, fmt.Errorf("host %s: migration: %w", host, err)
	}
	return a.Owing, nil
}

// Done tells host, the source of a post-copy migration, that this host
// holds every object of the run d names, or needs none (POST
// /v1/migrations/done).
func (p Hosts) Done(ctx context.Context, host record.Address, d Done) error {
	_, err := p.post(ctx, host, "/v1/migrations/done", d)
	return err
}

// Held asks host, the source of a post-copy migration, whether it still
// holds the run q names for this host (POST /v1/migrations/held). Only a
// 200 whose body says "held" is an answer; any other (an older host,
// which lacks the route) is an error.
func (p Hosts) Held(ctx context.Context, host record.Address, q Held) (bool, error) {
	b, err := p.post(ctx, host, "/v1/migrations/held", q)
	if err != nil {
		return false, err
	}
	var a struct {
		Held *bool `json:"held"`
	}
	if err := json.Unmarshal(b, &a); err != nil || a.Held == nil {
		return false, fmt.Errorf("host %s: held: not an answer (%v): %.64q", host, err, b)
	}
	return *a.Held, nil
}

// post posts body, as JSON, to route on host and returns the answer.
func (p Hosts) post(ctx context.Context, host record.Address, route string, body any) ([]byte, error) {
	c, base, done, err := p.client(ctx, host)
	if err != nil {
		return nil, err
	}
	defer done()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+route, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return call(c, host, req, maxAnswer)
}

// Source is host's objects as a post-copy migration's target reads them
// (transfer.Owed), until done is called.
func (p Hosts) Source(ctx context.Context, host record.Address) (_ transfer.Source, done func(), _ error) {
	c, base, done, err := p.client(ctx, host)
	if err != nil {
		return transfer.Source{}, nil, err
	}
	return transfer.Source{Client: c, Base: base}, done, nil
}

// FetchOptions are what a fetched run's objects are held to: the store
// they are staged for, a bundle's limits, and the room the store has for
// them (transfer.Options.Free; nil: not bounded).
type FetchOptions struct {
	Store  *store.Store
	Limits bundle.Limits
	Free   func() (uint64, error)
	// Owe: the slabs of the run's last memory image are owed, not
	// fetched (transfer.Options.Owe, the source being host).
	Owe bool
	// Rehashed: held objects rehashed ahead (transfer.Options.Rehashed).
	Rehashed func(record.Address) (time.Time, bool)
}

// Fetch brings run's record from host, has judge judge it, then stages
// the objects it reaches (transfer.Stage) over the same client, held to
// the store's room (opt.Free).
func (p Hosts) Fetch(ctx context.Context, host record.Address, run string, judge func(*record.Record) error, opt FetchOptions) (*record.Record, *transfer.Fetched, error) {
	c, base, done, err := p.client(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/records/"+url.PathEscape(run), nil)
	if err != nil {
		return nil, nil, err
	}
	b, err := call(c, host, req, opt.Limits.Or(bundle.DefaultLimits).JSON)
	if err != nil {
		return nil, nil, err
	}
	rec, err := record.DecodeWire(b)
	if err != nil {
		return nil, nil, fmt.Errorf("host %s: run %s's record: %w", host, run, err)
	}
	if err := judge(rec); err != nil {
		return nil, nil, err
	}
	st := opt.Store
	o := transfer.Options{Limits: opt.Limits, Free: opt.Free, Rehashed: opt.Rehashed}
	if opt.Owe {
		o.Owe = host
	}
	f, _, err := transfer.Stage(ctx, transfer.Source{Client: c, Base: base}, st, rec, o)
	if err != nil {
		return nil, nil, err
	}
	return rec, f, nil
}

// Offer asks host what it can take now: the names are asked about
// MaxOfferImages at a time, and an answer is taken only within bounds
// (checkOffer) — it is another host's word, kept for a whole drain.
func (p Hosts) Offer(ctx context.Context, host record.Address, images []string) (drain.Offer, error) {
	c, base, done, err := p.client(ctx, host)
	if err != nil {
		return drain.Offer{}, err
	}
	defer done()
	var out drain.Offer
	for first := true; first || len(images) > 0; first = false {
		batch := images[:min(len(images), MaxOfferImages)]
		images = images[len(batch):]
		a, err := offerFrom(ctx, c, base, host, batch)
		if err != nil {
			return drain.Offer{}, err
		}
		if first {
			out = drain.Offer{Facts: a.Facts, Images: map[string]string{}, Free: a.Free, Draining: a.Draining, ImageParks: a.ImageParks,
				EgressNames: a.EgressNames, PostCopy: a.PostCopy}
			if out.EgressAllow, err = ceilingOf(host, a.EgressAllow); err != nil {
				return drain.Offer{}, err
			}
		}
		for _, name := range batch {
			if d, ok := a.Images[name]; ok {
				out.Images[name] = d
			}
		}
	}
	return out, nil
}

// offerFrom asks host for its offer over names.
func offerFrom(ctx context.Context, c *http.Client, base string, host record.Address, names []string) (OfferAnswer, error) {
	body, _ := json.Marshal(OfferRequest{Images: names})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/placement", bytes.NewReader(body))
	if err != nil {
		return OfferAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	b, err := call(c, host, req, maxAnswer)
	if err != nil {
		return OfferAnswer{}, err
	}
	var a OfferAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return OfferAnswer{}, fmt.Errorf("host %s: placement: %w", host, err)
	}
	return a, checkOffer(host, a)
}

// Bounds on another host's offer: a host's facts are a dozen short
// strings (the CPU's features the longest, about 2 KiB).
const (
	maxOfferFacts  = 64
	maxOfferValue  = 8 << 10
	maxOfferEgress = 1024 // prefixes of an egress ceiling
)

func checkOffer(host record.Address, a OfferAnswer) error {
	if len(a.Facts) > maxOfferFacts || len(a.Images) > MaxOfferImages || len(a.EgressAllow) > maxOfferEgress {
		return fmt.Errorf("host %s: placement: %w: %d facts, %d images, %d egress prefixes", host, bundle.ErrLimit, len(a.Facts), len(a.Images), len(a.EgressAllow))
	}
	for k, v := range a.Facts {
		if len(k) > maxOfferValue || len(v) > maxOfferValue {
			return fmt.Errorf("host %s: placement: %w: a fact over %d bytes", host, bundle.ErrLimit, maxOfferValue)
		}
	}
	return nil
}

// ceilingOf is another host's egress ceiling, as its offer gives it:
// IPv4 prefixes only (an answer with any other is refused, ErrLimit).
func ceilingOf(host record.Address, ps []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range ps {
		p, err := netip.ParsePrefix(c)
		if err != nil || !p.Addr().Is4() {
			return nil, fmt.Errorf("host %s: placement: %w: egress ceiling %.64q: not an IPv4 prefix", host, bundle.ErrLimit, c)
		}
		out = append(out, p)
	}
	return out, nil
}

// call sends req and reads an answer of at most limit bytes: the body of a
// 200, or the other host's refusal as a RemoteError.
func call(c *http.Client, host record.Address, req *http.Request, limit int64) ([]byte, error) {
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("host %s: %w", host, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("host %s: %w", host, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("host %s: %w: an answer over %d bytes", host, bundle.ErrLimit, limit)
	}
	if resp.StatusCode != http.StatusOK {
		e := &RemoteError{Host: host}
		if json.Unmarshal(b, &e.Answer) != nil || e.Answer.Code == "" {
			e.Answer.Code, e.Answer.Message = api.CodeUnavailable, fmt.Sprintf("status %d", resp.StatusCode)
		}
		return nil, e
	}
	return b, nil
}
