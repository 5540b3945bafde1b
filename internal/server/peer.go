package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/drain"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/member"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/peer"
	"github.com/runrecordd/runrecordd/internal/transfer"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The fleet's peer routes, served to admitted host keys on the mutual-TLS
// listener (docs/fleet.md, "Migration"), and the client side of them.
//
//	GET  /v1/objects/{addr}   an object's bytes (internal/transfer), to a
//	                          host this one is handing a run to that
//	                          reaches the object (member.ServesObject)
//	POST /v1/objects/missing  which of a list this host lacks, to a host
//	                          this one is handing a run to
//	GET  /v1/records/{id}     a run's record, wire form, to the host this
//	                          one is handing the run to
//	                          (member.ServesRecord)
//	POST /v1/migrations       {"run": ID, "genesis": G, "head": H,
//	                          "resume": B}: take the run the calling host
//	                          handed to this one, once the directory says
//	                          so (member.Receive; resumed when B); answers
//	                          the run as held here
//	POST /v1/placement        {"images": [NAME...]}: what this host can
//	                          take now (daemon.Daemon.Offer), before a drain
//
// A refusal of the directory or of the transfers served is 403
// (forbidden), as a key whose role may not use the route.

// PeerRoutes are the patterns of the peer routes, which the mutual-TLS
// listener serves to host keys only (everything else there is the client
// API, for platform keys).
var PeerRoutes = []string{"/v1/objects/", "/v1/records/", "/v1/migrations", "/v1/placement"}

// Peer is the peer routes' handler; the caller admits host keys only
// (peer.Require), and the calling host is the one its key names.
func Peer(deps Deps, log *slog.Logger) http.Handler {
	h := newHandler(deps, log)
	mux := http.NewServeMux()
	objects := deps.Objects
	mux.HandleFunc("GET /v1/objects/{addr}", func(w http.ResponseWriter, r *http.Request) {
		a, err := record.ParseAddress(r.PathValue("addr"))
		if err == nil {
			err = served(r, func(key record.Address) error { return h.Fleet.ServesObject(key, a) })
		}
		if err != nil {
			h.fail(w, r, err)
			return
		}
		objects.ServeHTTP(w, r)
	})
	mux.HandleFunc("POST /v1/objects/missing", func(w http.ResponseWriter, r *http.Request) {
		if err := served(r, h.Fleet.Serves); err != nil {
			h.fail(w, r, err)
			return
		}
		objects.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /v1/records/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := served(r, func(key record.Address) error { return h.Fleet.ServesRecord(key, id) }); err != nil {
			h.fail(w, r, err)
			return
		}
		h.record(w, r)
	})
	mux.HandleFunc("POST /v1/migrations", h.receive)
	mux.HandleFunc("POST /v1/placement", h.offer)
	return mux
}

// served asks serves whether the calling host (its verified key) may read
// what it asks for.
func served(r *http.Request, serves func(key record.Address) error) error {
	key, _, ok := peer.KeyOf(r)
	if !ok {
		return fmt.Errorf("%w: no verified host key", member.ErrUnsolicited)
	}
	return serves(key)
}

// maxOfferImages bounds the image names one placement request asks about.
const maxOfferImages = 1024

// offerRequest and offerAnswer are POST /v1/placement's body and answer.
type offerRequest struct {
	Images []string `json:"images"`
}

type offerAnswer struct {
	Facts      map[string]string `json:"facts"`
	Images     map[string]string `json:"images"`
	Free       uint64            `json:"free"`
	Draining   bool              `json:"draining"`
	ImageParks bool              `json:"image_parks"`
}

func (h *handler) offer(w http.ResponseWriter, r *http.Request) {
	var q offerRequest
	if err := decode(w, r, &q); err != nil {
		h.fail(w, r, err)
		return
	}
	if len(q.Images) > maxOfferImages {
		h.fail(w, r, fmt.Errorf("%w: %d image names, at most %d", answers.ErrInvalid, len(q.Images), maxOfferImages))
		return
	}
	o, err := h.d.Offer(r.Context(), q.Images)
	h.reply(w, r, offerAnswer{Facts: o.Facts, Images: o.Images, Free: o.Free, Draining: o.Draining, ImageParks: o.ImageParks}, err)
}

// migration is POST /v1/migrations's body: the run, and whether to resume
// it (it was executing on the host handing it over).
type migration struct {
	Run     string         `json:"run"`
	Genesis record.Address `json:"genesis"`
	Head    record.Address `json:"head"`
	Resume  bool           `json:"resume"`
}

func (h *handler) receive(w http.ResponseWriter, r *http.Request) {
	from, _, ok := peer.KeyOf(r)
	if !ok {
		writeJSON(w, http.StatusForbidden, &api.Error{Code: api.CodeForbidden, Message: "no verified host key"})
		return
	}
	var m migration
	if err := decode(w, r, &m); err != nil {
		h.fail(w, r, err)
		return
	}
	h.moved(w, r, m.Run, h.Fleet.Receive(r.Context(), from, member.Handed{Run: m.Run, Genesis: m.Genesis, Head: m.Head, Resume: m.Resume}))
}

// Peers reach the fleet's other hosts at the address their session gives,
// over mutual TLS pinned to their key (member.Peers).
type Peers struct {
	Dir *fleet.Dir
	Key ed25519.PrivateKey // this host's
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
// one call: the caller closes its idle connections when done (a peer
// listener holds 64 connections from one address, docs/fleet.md).
func (p Peers) client(ctx context.Context, host record.Address) (*http.Client, string, error) {
	m, err := p.Dir.Member(ctx, host)
	if err != nil {
		return nil, "", err
	}
	if m.Role != fleet.RoleHost || m.Peer == "" {
		return nil, "", fmt.Errorf("host %s: %w: no live session serving the fleet", host, fleet.ErrNotAdmitted)
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{TLSClientConfig: peer.ClientConfig(p.Key, host), DialContext: dialer.DialContext,
		TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: 10 * time.Minute}
	return &http.Client{Transport: tr}, "https://" + m.Peer, nil
}

// Hand implements member.Peers.
func (p Peers) Hand(ctx context.Context, host record.Address, h member.Handed) error {
	c, base, err := p.client(ctx, host)
	if err != nil {
		return err
	}
	defer c.CloseIdleConnections()
	body, _ := json.Marshal(migration{Run: h.Run, Genesis: h.Genesis, Head: h.Head, Resume: h.Resume})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/migrations", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	_, err = call(c, host, req, maxJSON)
	return err
}

// Fetch implements member.Peers: the record, then transfer.Stage over
// the same client, held to the store's room past its minimum free space
// (park.Free).
func (p Peers) Fetch(ctx context.Context, host record.Address, run string, judge func(*record.Record) error, opt member.FetchOptions) (*record.Record, member.Arrival, error) {
	c, base, err := p.client(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	defer c.CloseIdleConnections()
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
	free := func() (uint64, error) { return park.Free(st, opt.MinFree) }
	f, _, err := transfer.Stage(ctx, c, base, st, rec, transfer.Options{Limits: opt.Limits, Free: free})
	if err != nil {
		return nil, nil, err
	}
	return rec, f, nil
}

// Offer implements member.Peers: the names are asked about
// maxOfferImages at a time, and an answer is taken only within bounds
// (checkOffer) — it is another host's word, kept for a whole drain.
func (p Peers) Offer(ctx context.Context, host record.Address, images []string) (drain.Offer, error) {
	c, base, err := p.client(ctx, host)
	if err != nil {
		return drain.Offer{}, err
	}
	defer c.CloseIdleConnections()
	var out drain.Offer
	for first := true; first || len(images) > 0; first = false {
		batch := images[:min(len(images), maxOfferImages)]
		images = images[len(batch):]
		a, err := offerFrom(ctx, c, base, host, batch)
		if err != nil {
			return drain.Offer{}, err
		}
		if first {
			out = drain.Offer{Facts: a.Facts, Images: map[string]string{}, Free: a.Free, Draining: a.Draining, ImageParks: a.ImageParks}
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
func offerFrom(ctx context.Context, c *http.Client, base string, host record.Address, names []string) (offerAnswer, error) {
	body, _ := json.Marshal(offerRequest{Images: names})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/placement", bytes.NewReader(body))
	if err != nil {
		return offerAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	b, err := call(c, host, req, maxJSON)
	if err != nil {
		return offerAnswer{}, err
	}
	var a offerAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return offerAnswer{}, fmt.Errorf("host %s: placement: %w", host, err)
	}
	return a, checkOffer(host, a)
}

// Bounds on another host's offer: a host's facts are a dozen short
// strings (the CPU's features the longest, about 2 KiB).
const (
	maxOfferFacts = 64
	maxOfferValue = 8 << 10
)

func checkOffer(host record.Address, a offerAnswer) error {
	if len(a.Facts) > maxOfferFacts || len(a.Images) > maxOfferImages {
		return fmt.Errorf("host %s: placement: %w: %d facts, %d images", host, bundle.ErrLimit, len(a.Facts), len(a.Images))
	}
	for k, v := range a.Facts {
		if len(k) > maxOfferValue || len(v) > maxOfferValue {
			return fmt.Errorf("host %s: placement: %w: a fact over %d bytes", host, bundle.ErrLimit, maxOfferValue)
		}
	}
	return nil
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
