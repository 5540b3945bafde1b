package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/tlskey"
)

// DefaultSocket is where a daemon started with its defaults listens.
const DefaultSocket = "/var/lib/runrecordd/runrecordd.sock"

// Client calls a daemon's API: as the operator over its unix socket
// (NewClient), or as a platform key over the fleet's mutual-TLS listener
// (NewTLSClient), where only the routes docs/fleet.md's table gives
// platform keys answer (the others are *Error forbidden).
type Client struct {
	base  string // the URL paths are joined to
	where string // the socket or address, for errors
	hc    *http.Client
}

// NewClient returns a client of the daemon listening on socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableCompression: true,
	}
	return &Client{base: "http://runrecordd", where: socket, hc: &http.Client{Transport: tr}}
}

// TLS is how a platform key reaches a daemon's mutual-TLS listener (serve
// --peer-listen; docs/clients.md).
type TLS struct {
	// Addr is the listener's host:port.
	Addr string
	// Certificate is the platform key's: one self-signed ed25519
	// certificate (tlskey.Certificate), e.g. the PEM pair `runrecordd
	// fleet key --tls-out DIR` writes, loaded with tls.LoadX509KeyPair.
	// The fleet must admit its key (fleet admit KEY --role platform).
	Certificate tls.Certificate
	// Host is the key id (b3:…) of the daemon's host key: a server that
	// does not hold that key is refused (tlskey.ErrPin).
	Host record.Address
}

// NewTLSClient returns a platform key's client of the daemon at t.Addr.
func NewTLSClient(t TLS) *Client {
	cert := t.Certificate
	tr := &http.Transport{
		TLSClientConfig:    tlskey.ClientConfig(func() (*tls.Certificate, error) { return &cert, nil }, t.Host),
		DisableCompression: true,
	}
	return &Client{base: "https://" + t.Addr, where: t.Addr, hc: &http.Client{Transport: tr}}
}

// Do sends a request with body in (JSON-encoded unless it is an
// io.Reader, sent as it is) and decodes a 2xx response into out (unless out
// is an io.Writer, which receives the body). A non-2xx response is an *Error.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch v := out.(type) {
	case nil:
		_, err = io.Copy(io.Discard, resp.Body)
	case io.Writer:
		_, err = io.Copy(v, resp.Body)
	default:
		err = json.NewDecoder(resp.Body).Decode(v)
	}
	return err
}

// send sends a request as Do does and returns its 2xx response, whose
// body the caller closes; a non-2xx response is an *Error.
func (c *Client) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	ctype := ""
	switch v := in.(type) {
	case nil:
	case io.Reader:
		body, ctype = v, "application/octet-stream"
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) && ne.Op == "dial" {
			hint := "start one with `runrecordd serve`, or point at it with --socket or RUNRECORDD_SOCKET"
			if strings.HasPrefix(c.base, "https:") {
				hint = "is the daemon serving --peer-listen there?"
			}
			return nil, &Error{Code: CodeDaemonUnreachable, Message: fmt.Sprintf("no daemon answers on %s (%v): %s", c.where, ne.Err, hint)}
		}
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		e := &Error{Status: resp.StatusCode}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, e) != nil || e.Code == "" {
			e.Code, e.Message = CodeInternal, fmt.Sprintf("daemon answered %s: %s", resp.Status, strings.TrimSpace(string(b)))
		}
		return nil, e
	}
	return resp, nil
}

// RunPath is the path of a run's resource, with suffix (e.g. "/park").
func RunPath(id, suffix string) string {
	return "/v1/runs/" + url.PathEscape(id) + suffix
}

// ImportImage imports an OCI or docker archive read from r under name
// (the archive's own name when empty).
func (c *Client) ImportImage(ctx context.Context, r io.Reader, name string) (Image, error) {
	var img Image
	err := c.Do(ctx, http.MethodPost, "/v1/images?name="+url.QueryEscape(name), r, &img)
	return img, err
}

// Start starts a run.
func (c *Client) Start(ctx context.Context, req RunRequest) (Run, error) {
	var r Run
	err := c.Do(ctx, http.MethodPost, "/v1/runs", req, &r)
	return r, err
}

// List lists runs, all of them or those in one phase.
func (c *Client) List(ctx context.Context, phase string) ([]Run, error) {
	var rs []Run
	p := "/v1/runs"
	if phase != "" {
		p += "?phase=" + url.QueryEscape(phase)
	}
	err := c.Do(ctx, http.MethodGet, p, nil, &rs)
	return rs, err
}

// Show returns a run in full.
func (c *Client) Show(ctx context.Context, id string) (Show, error) {
	var s Show
	err := c.Do(ctx, http.MethodGet, RunPath(id, ""), nil, &s)
	return s, err
}

// Park parks a run.
func (c *Client) Park(ctx context.Context, id string) (Park, error) {
	var p Park
	err := c.Do(ctx, http.MethodPost, RunPath(id, "/park"), nil, &p)
	return p, err
}

// Resume resumes a parked run.
func (c *Client) Resume(ctx context.Context, id string) (Resume, error) {
	return c.ResumeWith(ctx, id, ResumeRequest{})
}

// ResumeWith resumes a parked run with req's body (its secrets).
func (c *Client) ResumeWith(ctx context.Context, id string, req ResumeRequest) (Resume, error) {
	var body any
	if len(req.Secrets) > 0 {
		body = req
	}
	var r Resume
	err := c.Do(ctx, http.MethodPost, RunPath(id, "/resume"), body, &r)
	return r, err
}

// Drain moves every run off the daemon's host to the fleet's others.
func (c *Client) Drain(ctx context.Context, req DrainRequest) (Drain, error) {
	var d Drain
	err := c.Do(ctx, http.MethodPost, "/v1/drain", req, &d)
	return d, err
}

// Adopt makes a run this host holds parked its own, when its owner in the
// fleet is gone.
func (c *Client) Adopt(ctx context.Context, id string) (Run, error) {
	var r Run
	err := c.Do(ctx, http.MethodPost, RunPath(id, "/adopt"), nil, &r)
	return r, err
}

// Migrate moves a run to the fleet's host whose key id is to.
func (c *Client) Migrate(ctx context.Context, id, to string) (Run, error) {
	var r Run
	err := c.Do(ctx, http.MethodPost, RunPath(id, "/migrate"), MigrateRequest{To: to}, &r)
	return r, err
}

// Close closes a run.
func (c *Client) Close(ctx context.Context, id, reason string) (Run, error) {
	var r Run
	err := c.Do(ctx, http.MethodPost, RunPath(id, "/close"), CloseRequest{Reason: reason}, &r)
	return r, err
}

// GC collects the daemon's store: it releases the image snapshots of
// closed runs past the retention time (retention when not nil), then
// removes what no record reaches.
func (c *Client) GC(ctx context.Context, retention, grace *time.Duration) (GC, error) {
	var req GCRequest
	if retention != nil {
		ns := int64(*retention)
		req.RetentionNS = &ns
	}
	if grace != nil {
		ns := int64(*grace)
		req.GraceNS = &ns
	}
	var out GC
	err := c.Do(ctx, http.MethodPost, "/v1/gc", req, &out)
	return out, err
}

// Pin keeps a run's snapshots whatever the retention time (pin false lets
// them go with it again).
func (c *Client) Pin(ctx context.Context, id string, pin bool) (Run, error) {
	method := http.MethodPost
	if !pin {
		method = http.MethodDelete
	}
	var r Run
	err := c.Do(ctx, method, RunPath(id, "/pin"), nil, &r)
	return r, err
}

// Verify verifies a run's record and its objects.
func (c *Client) Verify(ctx context.Context, id string) (Verify, error) {
	var v Verify
	err := c.Do(ctx, http.MethodGet, RunPath(id, "/verify"), nil, &v)
	return v, err
}

// Export writes a run's bundle to w and hands the run off: its host will
// not resume or close it until a bundle extending it is imported back.
func (c *Client) Export(ctx context.Context, id string, w io.Writer) error {
	return c.Do(ctx, http.MethodGet, RunPath(id, "/export"), nil, w)
}

// ExportCopy writes a run's bundle to w without handing the run off; the
// bundle is marked a copy, which an importing host never resumes.
func (c *Client) ExportCopy(ctx context.Context, id string, w io.Writer) error {
	return c.Do(ctx, http.MethodGet, RunPath(id, "/export")+"?handoff=false", nil, w)
}

// Import imports a bundle read from r, as run id (the bundle's own id
// when empty).
func (c *Client) Import(ctx context.Context, r io.Reader, id string) (Import, error) {
	return c.ImportWith(ctx, r, id, false)
}

// ImportWith is Import; with reclaim, the very bundle this host exported
// takes a handed-off run back (the caller vouches that no other host
// resumed from it).
func (c *Client) ImportWith(ctx context.Context, r io.Reader, id string, reclaim bool) (Import, error) {
	var im Import
	q := "/v1/import?id=" + url.QueryEscape(id)
	if reclaim {
		q += "&reclaim=true"
	}
	err := c.Do(ctx, http.MethodPost, q, r, &im)
	return im, err
}

// TrustedKeys lists the host keys the daemon trusts.
func (c *Client) TrustedKeys(ctx context.Context) ([]TrustedKey, error) {
	var keys []TrustedKey
	err := c.Do(ctx, http.MethodGet, "/v1/trust", nil, &keys)
	return keys, err
}

// Trust trusts a host key (its id, b3:…) under name.
func (c *Client) Trust(ctx context.Context, key, name string) (TrustedKey, error) {
	var k TrustedKey
	err := c.Do(ctx, http.MethodPost, "/v1/trust", TrustedKey{Key: key, Name: name}, &k)
	return k, err
}

// Untrust stops trusting a host key.
func (c *Client) Untrust(ctx context.Context, key string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/trust/"+url.PathEscape(key), nil, nil)
}

// Host describes the daemon's host.
func (c *Client) Host(ctx context.Context) (Host, error) {
	var h Host
	err := c.Do(ctx, http.MethodGet, "/v1/host", nil, &h)
	return h, err
}

// Calls lists the outstanding outward calls of every open run.
func (c *Client) Calls(ctx context.Context) ([]Call, error) {
	var cs []Call
	err := c.Do(ctx, http.MethodGet, "/v1/calls", nil, &cs)
	return cs, err
}

// PostResult posts the result (JSON) of run's call.
func (c *Client) PostResult(ctx context.Context, run, call string, payload []byte) (PostResult, error) {
	var pr PostResult
	err := c.Do(ctx, http.MethodPost, RunPath(run, "/calls/"+url.PathEscape(call)+"/result"), bytes.NewReader(payload), &pr)
	return pr, err
}

// WaitProof returns a run's wait-proof verdict.
func (c *Client) WaitProof(ctx context.Context, id string) (WaitProof, error) {
	var v WaitProof
	err := c.Do(ctx, http.MethodGet, RunPath(id, "/wait-proof"), nil, &v)
	return v, err
}

// Events calls fn with every transition until ctx is done or fn returns
// false.
func (c *Client) Events(ctx context.Context, fn func(Event) bool) error {
	return c.Subscribe(ctx, nil, fn)
}

// Subscribe is Events that calls subscribed, when not nil, once the
// daemon has subscribed the stream: every transition after that call
// reaches fn. It returns io.EOF when the daemon ends the stream (it
// stops), nil when ctx is done or fn returns false.
func (c *Client) Subscribe(ctx context.Context, subscribed func(), fn func(Event) bool) error {
	resp, err := c.send(ctx, http.MethodGet, "/v1/events", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if subscribed != nil {
		subscribed()
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var e Event
		if err := dec.Decode(&e); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !fn(e) {
			return nil
		}
	}
}
