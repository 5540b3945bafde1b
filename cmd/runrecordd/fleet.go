package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/internal/host"
	"github.com/runrecordd/runrecordd/internal/server"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// maxEtcdTimeout is the longest --etcd-timeout: a host waits no longer
// than this to learn that etcd does not answer.
const maxEtcdTimeout = time.Minute

// etcdFlags reach a fleet's etcd (docs/fleet.md, "Running against an
// existing etcd").
type etcdFlags struct {
	endpoints, prefix string
	timeout           time.Duration // each request's bound
	// Client TLS (each a PEM file) and etcd's authentication.
	cacert, cert, key  string
	user, passwordFile string
	// log, when set (serve), gets the etcd client's warnings and errors;
	// unset, the client logs nothing.
	log *slog.Logger
}

func (e *etcdFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.endpoints, "etcd", "", "the fleet's etcd endpoints, comma-separated (none: this host runs alone)")
	fs.StringVar(&e.prefix, "etcd-prefix", fleet.DefaultPrefix, "the fleet's key prefix in etcd")
	fs.DurationVar(&e.timeout, "etcd-timeout", fleet.DefaultTimeout, "how long each request to etcd may take before the host acts as if it was not applied")
	fs.StringVar(&e.cacert, "etcd-cacert", "", "verify etcd's serving certificate with this CA bundle (PEM): the endpoints are https")
	fs.StringVar(&e.cert, "etcd-cert", "", "present this client certificate (PEM) to etcd; with --etcd-key")
	fs.StringVar(&e.key, "etcd-key", "", "the client certificate's private key (PEM)")
	fs.StringVar(&e.user, "etcd-user", "", "authenticate to etcd as this user; with --etcd-password-file")
	fs.StringVar(&e.passwordFile, "etcd-password-file", "", "a file holding the etcd user's password (its first line)")
}

// config is the etcd client's configuration from the flags: the one place
// they meet the client (TLS, authentication).
func (e *etcdFlags) config() (clientv3.Config, error) {
	cfg := clientv3.Config{Endpoints: strings.Split(e.endpoints, ","), DialTimeout: e.timeout, Logger: zap.NewNop()}
	if e.log != nil {
		cfg.Logger = zapToSlog(e.log.With("from", "etcd-client"), zapcore.WarnLevel)
	}
	if (e.cert == "") != (e.key == "") {
		return cfg, usagef("--etcd-cert and --etcd-key go together")
	}
	if e.cacert != "" || e.cert != "" {
		info := transport.TLSInfo{CertFile: e.cert, KeyFile: e.key, TrustedCAFile: e.cacert}
		tc, err := info.ClientConfig()
		if err != nil {
			return cfg, fmt.Errorf("etcd client TLS: %w", err)
		}
		cfg.TLS = tc
	}
	if (e.user == "") != (e.passwordFile == "") {
		return cfg, usagef("--etcd-user and --etcd-password-file go together")
	}
	if e.user != "" {
		b, err := os.ReadFile(e.passwordFile)
		if err != nil {
			return cfg, fmt.Errorf("--etcd-password-file: %w", err)
		}
		pw, _, _ := strings.Cut(string(b), "\n")
		cfg.Username, cfg.Password = e.user, strings.TrimSuffix(pw, "\r")
	}
	return cfg, nil
}

// dir connects to the fleet's directory; the caller closes it.
func (e *etcdFlags) dir() (*fleet.Dir, io.Closer, error) {
	if e.endpoints == "" {
		return nil, nil, usagef("--etcd: the fleet's etcd endpoints are required")
	}
	if e.timeout <= 0 || e.timeout > maxEtcdTimeout {
		return nil, nil, usagef("--etcd-timeout %v: give one over 0 and at most %v", e.timeout, maxEtcdTimeout)
	}
	cfg, err := e.config()
	if err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("etcd %s: %w", e.endpoints, err)
	}
	return fleet.New(cli, e.prefix, e.timeout), cli, nil
}

// hostKeyID is the key id of the host key in a state directory, making
// the key when there is none (as the daemon does at its first start).
func hostKeyID(state string) (record.Address, error) {
	if err := os.MkdirAll(state, 0o700); err != nil {
		return record.Address{}, err
	}
	key, err := attest.LoadOrCreateKey(filepath.Join(state, "host.key"))
	if err != nil {
		return record.Address{}, err
	}
	return attest.KeyID(key.Public().(ed25519.PublicKey)), nil
}

// joinFleet joins this host, whose key must be admitted, to the fleet:
// the daemon appends only while the session's lease lives. The returned
// closer ends the session and the connection.
//
// peerAddr, when not empty, is where this host serves the fleet
// (--peer-listen): the session says so, and the host takes and sends runs.
func joinFleet(ctx context.Context, e etcdFlags, state string, ttl time.Duration, peerAddr string) (*fleet.Dir, *fleet.Session, func(), error) {
	dir, cli, err := e.dir()
	if err != nil {
		return nil, nil, nil, err
	}
	key, err := hostKeyID(state)
	if err == nil {
		var m fleet.Member
		if m, err = dir.Member(ctx, key); err == nil && m.Role != fleet.RoleHost {
			err = fmt.Errorf("key %s is admitted as %s, not as a host", key, m.Role)
		}
	}
	if errors.Is(err, fleet.ErrNotAdmitted) {
		err = fmt.Errorf("%w: admit this host first: runrecordd fleet admit %s --name NAME --etcd %s", err, key, e.endpoints)
	}
	var h *fleet.Session
	if err == nil {
		h, err = dir.JoinAt(ctx, key, ttl, peerAddr)
	}
	if err != nil {
		cli.Close()
		return nil, nil, nil, fmt.Errorf("fleet: %w", err)
	}
	return dir, h, func() {
		cctx, cancel := context.WithTimeout(context.Background(), e.timeout)
		defer cancel()
		_ = h.Close(cctx)
		cli.Close()
	}, nil
}

// cmdFleet is `fleet key`, `fleet admit`, `fleet revoke` and `fleet status`: the
// operator's side of a fleet, against its etcd (docs/fleet.md).
func cmdFleet(args []string, stdout io.Writer) error {
	const use = "usage: runrecordd fleet key [--state-dir DIR] [--public] | fleet key --tls-out DIR | fleet admit KEY --name NAME [--role host|platform] --etcd ENDPOINTS | fleet revoke KEY --etcd ENDPOINTS | fleet status --etcd ENDPOINTS"
	if len(args) == 0 {
		return usagef(use)
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("fleet "+sub, flag.ContinueOnError)
	var e etcdFlags
	state, name, role := host.DefaultStateDir, "", string(fleet.RoleHost)
	var public bool // fleet key
	var tlsOut string
	switch sub {
	case "key":
		fs.StringVar(&state, "state-dir", host.DefaultStateDir, "the daemon's state directory")
		fs.BoolVar(&public, "public", false, "print the host key's raw ed25519 public key (hex), which clients without BLAKE3 pin")
		fs.StringVar(&tlsOut, "tls-out", "", "make (or reuse) a platform key in DIR (key.pem) and write a long-lived certificate of it (cert.pem); print its key id")
	case "admit":
		e.register(fs)
		fs.StringVar(&name, "name", "", "the host's or platform's name")
		fs.StringVar(&role, "role", role, "host (a peer that owns runs) or platform (a client of the API)")
	case "status", "revoke":
		e.register(fs)
	default:
		return usagef(use)
	}
	output := fs.String("o", "table", "output: table or json")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := checkOutput(*output); err != nil {
		return err
	}
	ctx, cancel := ctx()
	defer cancel()
	var out fleetOutput
	switch {
	case sub == "key" && len(pos) == 0 && tlsOut != "" && !public:
		var k record.Address
		k, err = fleetTLSOut(tlsOut)
		out = fleetKey{Key: k.String()}
	case sub == "key" && len(pos) == 0 && tlsOut == "" && public:
		var pub string
		pub, err = hostPublicKey(state)
		out = fleetKey{PublicKey: pub}
	case sub == "key" && len(pos) == 0 && tlsOut == "":
		var k record.Address
		k, err = hostKeyID(state)
		out = fleetKey{Key: k.String()}
	case sub == "admit" && len(pos) == 1:
		out, err = fleetAdmit(ctx, e, pos[0], name, fleet.Role(role))
	case sub == "revoke" && len(pos) == 1:
		out, err = fleetRevoke(ctx, e, pos[0])
	case sub == "status" && len(pos) == 0:
		out, err = fleetStatus(ctx, e)
	default:
		return usagef(use)
	}
	if err != nil {
		return err
	}
	return printAs(stdout, *output, out, out.table)
}

// fleetOutput is what a fleet sub-verb prints: a table, or itself as JSON
// (-o json; docs/cli.md lists each one's fields).
type fleetOutput interface {
	table(w io.Writer)
}

// fleetKey is `fleet key`'s output: the key id, or with --public the raw
// public key.
type fleetKey struct {
	Key       string `json:"key,omitempty"`
	PublicKey string `json:"public_key,omitempty"`
}

func (k fleetKey) table(w io.Writer) {
	if k.PublicKey != "" {
		fmt.Fprintln(w, k.PublicKey)
		return
	}
	fmt.Fprintln(w, k.Key)
}

// fleetMember is a member of the fleet as `fleet admit`, `fleet revoke`
// and `fleet status` print it. Lease is the live session's etcd lease (hex),
// empty when there is none.
type fleetMember struct {
	Key      string `json:"key"`
	Name     string `json:"name"`
	Role     string `json:"role"`
	Lease    string `json:"lease,omitempty"`
	Peer     string `json:"peer,omitempty"`
	Runs     int    `json:"runs"`
	Draining bool   `json:"draining"`
}

func memberOf(m fleet.Member) fleetMember {
	fm := fleetMember{Key: m.Key.String(), Name: m.Name, Role: string(m.Role), Peer: m.Peer, Draining: m.Draining}
	if m.Lease != 0 {
		fm.Lease = fmt.Sprintf("%x", m.Lease)
	}
	return fm
}

type fleetAdmitted struct {
	Admitted fleetMember `json:"admitted"`
}

func (a fleetAdmitted) table(w io.Writer) {
	fmt.Fprintf(w, "admitted %s (%s) as %s\n", a.Admitted.Key, printable(a.Admitted.Name), a.Admitted.Role)
}

func fleetAdmit(ctx context.Context, e etcdFlags, keyText, name string, role fleet.Role) (fleetOutput, error) {
	key, err := trust.ParseKey(keyText)
	if err != nil {
		return nil, usagef("fleet admit: %v", err)
	}
	dir, cli, err := e.dir()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	if err := dir.Admit(ctx, key, name, role); err != nil {
		return nil, err
	}
	return fleetAdmitted{fleetMember{Key: key.String(), Name: name, Role: string(role)}}, nil
}

// fleetStatusOut is `fleet status`: the fleet's members, each with
// whether its session is alive, how many runs it owns and whether it is
// being drained, and the orphaned runs.
type fleetStatusOut struct {
	Members []fleetMember `json:"members"`
	Orphans []fleetOrphan `json:"orphans"`
}

// fleetOrphan is a run whose owner's session is gone.
type fleetOrphan struct {
	Genesis string `json:"genesis"`
	Run     string `json:"run"`
	Phase   string `json:"phase"`
	Owner   string `json:"owner"`
}

func (s fleetStatusOut) table(w io.Writer) {
	fmt.Fprintln(w, "KEY\tNAME\tROLE\tSESSION\tRUNS\tDRAIN")
	for _, m := range s.Members {
		session, drain := "none", "-"
		if m.Lease != "" {
			session = "lease " + m.Lease
		}
		if m.Draining {
			drain = "draining"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", m.Key, printable(m.Name), m.Role, session, m.Runs, drain)
	}
	fmt.Fprintf(w, "orphaned runs: %d\n", len(s.Orphans))
	for _, o := range s.Orphans {
		fmt.Fprintf(w, "  %s\t%s\t%s\towner %s\n", o.Genesis, printable(o.Run), o.Phase, o.Owner)
	}
}

func fleetStatus(ctx context.Context, e etcdFlags) (fleetOutput, error) {
	dir, cli, err := e.dir()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	hosts, err := dir.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	out := fleetStatusOut{Members: []fleetMember{}, Orphans: []fleetOrphan{}}
	for _, h := range hosts {
		owned, err := dir.Owned(ctx, h.Key)
		if err != nil {
			return nil, err
		}
		m := memberOf(h)
		m.Runs = len(owned)
		out.Members = append(out.Members, m)
	}
	orphans, err := dir.Orphans(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range orphans {
		out.Orphans = append(out.Orphans, fleetOrphan{Genesis: o.Genesis.String(), Run: o.Run, Phase: o.Phase.String(), Owner: o.Owner.String()})
	}
	return out, nil
}

// peerHandlers are the two route tables of the fleet's listener: the
// platform keys' (server.NewPlatform) and the host keys' (server.Peer).
type peerHandlers struct {
	platform, host http.Handler
}

// peerServer serves, on the fleet's mutual-TLS listener (internal/fleet/peer;
// docs/fleet.md, "Peer listener and keys"), this host's objects to admitted
// host keys and the platform keys' route table to admitted platform keys:
// each role gets nothing of the other's routes, and a key nobody admitted
// nothing at all.
func peerServer(state, addr string, dir *fleet.Dir, h peerHandlers, log *slog.Logger) (*http.Server, net.Listener, error) {
	key, err := attest.LoadOrCreateKey(filepath.Join(state, "host.key"))
	if err != nil {
		return nil, nil, err
	}
	l, err := peer.Listen(addr, peer.ServerConfig(key, peer.Members(dir)), peer.Limits{})
	if err != nil {
		return nil, nil, fmt.Errorf("--peer-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	for _, p := range server.PeerRoutes {
		mux.Handle(p, peer.Require(fleet.RoleHost, h.host))
	}
	mux.Handle("/", h.platform) // server.NewPlatform: platform keys only
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	return srv, l, nil
}

// peers are the peer client (peer.Hosts) in the member room's role
// (member.Peers).
type peers struct{ peer.Hosts }

var _ member.Peers = peers{}

func (p peers) Hand(ctx context.Context, host record.Address, h member.Handed) (bool, error) {
	return p.Hosts.Hand(ctx, host, peer.Migration{Run: h.Run, Genesis: h.Genesis, Head: h.Head, Resume: h.Resume, Held: h.Held})
}

func (p peers) Done(ctx context.Context, host record.Address, h member.Handed) error {
	return p.Hosts.Done(ctx, host, peer.Done{Run: h.Run, Genesis: h.Genesis, Head: h.Head})
}

func (p peers) Held(ctx context.Context, host record.Address, h member.Handed) (bool, error) {
	return p.Hosts.Held(ctx, host, peer.Held{Run: h.Run, Genesis: h.Genesis, Head: h.Head})
}

func (p peers) Fetch(ctx context.Context, host record.Address, run string, judge func(*record.Record) error, opt member.FetchOptions) (*record.Record, member.Arrival, error) {
	rec, f, err := p.Hosts.Fetch(ctx, host, run, judge, peer.FetchOptions{Store: opt.Store, Limits: opt.Limits, Free: opt.Free, Owe: opt.Owe, Rehashed: opt.Rehashed})
	if err != nil {
		return nil, nil, err
	}
	return rec, f, nil
}
