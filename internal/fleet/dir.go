package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// DefaultPrefix is the key prefix of a fleet's directory in etcd.
const DefaultPrefix = "/runrecordd/"

// DefaultTimeout bounds each etcd request of a [Dir] whose Timeout is 0.
const DefaultTimeout = 5 * time.Second

// Dir is a fleet's directory in etcd: admitted keys, live hosts and runs.
// It reads and admits; owning runs needs a joined [Session].
type Dir struct {
	cli     *clientv3.Client
	prefix  string
	timeout time.Duration
}

// New returns the directory under prefix ([DefaultPrefix] when empty),
// whose every etcd request is bounded by timeout ([DefaultTimeout] when 0).
func New(cli *clientv3.Client, prefix string, timeout time.Duration) *Dir {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Dir{cli: cli, prefix: prefix, timeout: timeout}
}

func (d *Dir) runKey(g record.Address) string   { return d.prefix + "runs/" + g.String() }
func (d *Dir) hostKey(k record.Address) string  { return d.prefix + "hosts/" + k.String() }
func (d *Dir) aliveKey(k record.Address) string { return d.prefix + "alive/" + k.String() }
func (d *Dir) runsPrefix() string               { return d.prefix + "runs/" }
func (d *Dir) hostsPrefix() string              { return d.prefix + "hosts/" }
func (d *Dir) alivePrefix() string              { return d.prefix + "alive/" }
func (d *Dir) drainingKey(k record.Address) string {
	return d.prefix + "draining/" + k.String()
}
func keyAddress(key, prefix string) (record.Address, error) {
	a, err := record.ParseAddress(strings.TrimPrefix(key, prefix))
	if err != nil {
		return a, fmt.Errorf("%w: key %q: %v", ErrEntry, key, err)
	}
	return a, nil
}

// unavailable wraps an error of the etcd client as ErrUnavailable.
func unavailable(op string, err error) error {
	return fmt.Errorf("%s: %w: %v", op, ErrUnavailable, err)
}

// bounded returns ctx bounded by the directory's timeout.
func (d *Dir) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.timeout)
}

// Admit records key as admitted with a name and role. Admitting a key
// again with its role renames it; another role is refused
// (ErrNotAdmitted): a key is a host or a platform, never both.
func (d *Dir) Admit(ctx context.Context, key record.Address, name string, role Role) error {
	if err := checkRole(role); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
	ctx, cancel := d.bounded(ctx)
	defer cancel()
	k := d.hostKey(key)
	m := Member{Key: key, Name: name, Role: role, Admitted: time.Now()}
	for {
		r, err := d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, string(m.encode()))).Else(clientv3.OpGet(k)).Commit()
		if err != nil {
			return unavailable("admit "+key.String(), err)
		}
		if r.Succeeded {
			return nil
		}
		kvs := r.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // removed meanwhile
		}
		old, err := decodeMember(key, kvs[0].Value)
		if err != nil {
			return err
		}
		if old.Role != role {
			return fmt.Errorf("host %s: %w: admitted as %s, not %s", key, ErrNotAdmitted, old.Role, role)
		}
		m.Admitted = old.Admitted
		r, err = d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", kvs[0].ModRevision)).
			Then(clientv3.OpPut(k, string(m.encode()))).Commit()
		if err != nil {
			return unavailable("admit "+key.String(), err)
		}
		if r.Succeeded {
			return nil
		}
	}
}

// Member returns the admitted key's record, with its live lease.
func (d *Dir) Member(ctx context.Context, key record.Address) (Member, error) {
	ctx, cancel := d.bounded(ctx)
	defer cancel()
	r, err := d.cli.Txn(ctx).Then(clientv3.OpGet(d.hostKey(key)), clientv3.OpGet(d.aliveKey(key)), clientv3.OpGet(d.drainingKey(key))).Commit()
	if err != nil {
		return Member{}, unavailable("host "+key.String(), err)
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Member{}, fmt.Errorf("host %s: %w", key, ErrNotAdmitted)
	}
	m, err := decodeMember(key, kvs[0].Value)
	if alive := r.Responses[1].GetResponseRange().Kvs; len(alive) == 1 {
		m.Lease, m.Peer = alive[0].Lease, string(alive[0].Value)
		dr := r.Responses[2].GetResponseRange().Kvs
		m.Draining = len(dr) == 1 && dr[0].Lease == m.Lease
	}
	return m, err
}

// Hosts lists every admitted key, hosts and platforms, in key order, each
// with the lease of its live session (0 when none), read at one revision.
func (d *Dir) Hosts(ctx context.Context) ([]Member, error) {
	kvs, alive, err := d.withAlive(ctx, "hosts", d.hostsPrefix())
	if err != nil {
		return nil, err
	}
	var out []Member
	for _, kv := range kvs {
		key, err := keyAddress(string(kv.Key), d.hostsPrefix())
		if err != nil {
			return nil, err
		}
		m, err := decodeMember(key, kv.Value)
		if err != nil {
			return nil, err
		}
		m.Lease, m.Peer, m.Draining = alive[key].lease, alive[key].peer, alive[key].draining
		out = append(out, m)
	}
	return out, nil
}

// Run returns the run's entry (ErrNoRun when the directory has none).
func (d *Dir) Run(ctx context.Context, genesis record.Address) (Entry, error) {
	ctx, cancel := d.bounded(ctx)
	defer cancel()
	r, err := d.cli.Get(ctx, d.runKey(genesis))
	if err != nil {
		return Entry{}, unavailable("run "+genesis.String(), err)
	}
	if len(r.Kvs) == 0 {
		return Entry{}, fmt.Errorf("run %s: %w", genesis, ErrNoRun)
	}
	return decodeEntry(genesis, r.Kvs[0].Value, r.Kvs[0].ModRevision)
}

// Orphans lists the runs, not closed, whose owner's lease is gone: the
// owner's live session, if any, is not the one that claimed them. They
// are read with the live sessions at one revision, in genesis order.
// A closed run needs no owner and is never listed.
func (d *Dir) Orphans(ctx context.Context) ([]Entry, error) {
	kvs, alive, err := d.withAlive(ctx, "orphans", d.runsPrefix())
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, kv := range kvs {
		g, err := keyAddress(string(kv.Key), d.runsPrefix())
		if err != nil {
			return nil, err
		}
		e, err := decodeEntry(g, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, err
		}
		if e.Phase != record.PhaseClosed && alive[e.Owner].lease != e.Lease {
			out = append(out, e)
		}
	}
	return out, nil
}

// Owned lists the entries whose owner is key, under any of its sessions,
// in genesis order: what a host reconciles with its store when it starts
// (docs/fleet.md, "Reconciling at start"). It reads every entry of the
// fleet.
func (d *Dir) Owned(ctx context.Context, key record.Address) ([]Entry, error) {
	ctx, cancel := d.bounded(ctx)
	defer cancel()
	r, err := d.cli.Get(ctx, d.runsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, unavailable("runs of "+key.String(), err)
	}
	var out []Entry
	for _, kv := range r.Kvs {
		g, err := keyAddress(string(kv.Key), d.runsPrefix())
		if err != nil {
			return nil, err
		}
		e, err := decodeEntry(g, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, err
		}
		if e.Owner == key {
			out = append(out, e)
		}
	}
	return out, nil
}

// withAlive reads every key under prefix and the live sessions, at one
// revision: what was claimed, and by which sessions still alive.
func (d *Dir) withAlive(ctx context.Context, op, prefix string) ([]*mvccpb.KeyValue, map[record.Address]session, error) {
	ctx, cancel := d.bounded(ctx)
	defer cancel()
	r, err := d.cli.Txn(ctx).Then(clientv3.OpGet(prefix, clientv3.WithPrefix()),
		clientv3.OpGet(d.alivePrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(d.prefix+"draining/", clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, nil, unavailable(op, err)
	}
	alive, err := d.leases(r.Responses[1].GetResponseRange().Kvs)
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range r.Responses[2].GetResponseRange().Kvs {
		k, err := keyAddress(string(kv.Key), d.prefix+"draining/")
		if s, ok := alive[k]; err == nil && ok && s.lease == kv.Lease {
			s.draining = true
			alive[k] = s
		}
	}
	return r.Responses[0].GetResponseRange().Kvs, alive, nil
}

// session is a live host session: its lease, and where it serves the
// fleet.
type session struct {
	lease    int64
	peer     string
	draining bool // its Host.Drain mark, under the same lease
}

// leases maps each live host's key id to its session.
func (d *Dir) leases(kvs []*mvccpb.KeyValue) (map[record.Address]session, error) {
	out := make(map[record.Address]session, len(kvs))
	for _, kv := range kvs {
		k, err := keyAddress(string(kv.Key), d.alivePrefix())
		if err != nil {
			return nil, err
		}
		out[k] = session{lease: kv.Lease, peer: string(kv.Value)}
	}
	return out, nil
}
