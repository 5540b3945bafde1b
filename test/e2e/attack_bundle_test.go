//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// trustHost makes to trust from's host key, as an operator does with
// `runrecordd trust add`: the bundles from exports its runs to.
func trustHost(t *testing.T, from, to *daemon) {
	t.Helper()
	ctx := context.Background()
	h, err := from.c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := to.c.Trust(ctx, h.KeyID, from.name); err != nil {
		t.Fatalf("%s daemon: trust %s's key: %v", to.name, from.name, err)
	}
}

// hostState is what an attack must leave as it was: the runs, the calls
// awaiting results, the objects stored (count and bytes) and nothing left
// in staging.
type hostState struct {
	runs    []string
	calls   []string
	objects int
	bytes   int64
	staging int64
}

func stateOf(t *testing.T, d *daemon) hostState {
	t.Helper()
	ctx := context.Background()
	var s hostState
	runs, err := d.c.List(ctx, "")
	if err != nil {
		t.Fatalf("%s daemon no longer serving: %v", d.name, err)
	}
	for _, r := range runs {
		s.runs = append(s.runs, r.ID+" "+r.Head)
	}
	calls, err := d.c.Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		s.calls = append(s.calls, c.Run+"/"+c.ID)
	}
	root := filepath.Join(d.state, "store", "objects")
	tmp := filepath.Join(root, "tmp") + "/"
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return nil
		}
		if strings.HasPrefix(p, tmp) {
			s.staging += fi.Size()
			return nil
		}
		s.objects++
		s.bytes += fi.Size()
		return nil
	})
	return s
}

// untouched checks that d is still serving and holds what it held.
func untouched(t *testing.T, d *daemon, was hostState) {
	t.Helper()
	if _, err := d.c.Host(context.Background()); err != nil {
		t.Fatalf("%s daemon no longer serving: %v", d.name, err)
	}
	now := stateOf(t, d)
	if !slices.Equal(now.runs, was.runs) || !slices.Equal(now.calls, was.calls) || now.objects != was.objects ||
		now.bytes != was.bytes || now.staging != 0 {
		t.Fatalf("the refused bundle changed the host:\nnow %+v\nwas %+v", now, was)
	}
}

// readBundle parses an exported bundle, of either format, into its
// record and objects.
func readBundle(t *testing.T, raw []byte) *bundletest.Bundle {
	t.Helper()
	b, _, err := bundletest.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rebuilt is b with a record of unit and grants over segs, carrying
// b's objects and add, less those the new record does not name
// directly or through an attestation or listing of b's.
func rebuilt(t *testing.T, b *bundletest.Bundle, unitID, grants record.Address, segs []record.Segment, add ...[]byte) *bundletest.Bundle {
	t.Helper()
	out := &bundletest.Bundle{Run: b.Run}
	out.Record = record.New(unitID, grants)
	for _, s := range segs {
		if _, err := out.Record.Append(s); err != nil {
			t.Fatal(err)
		}
	}
	all := &bundletest.Bundle{Objects: append([]bundletest.Object(nil), b.Objects...)}
	for _, p := range add {
		all.Add(p)
	}
	keep := map[record.Address]bool{unitID: true, grants: true}
	for _, s := range segs {
		switch s.Kind {
		case record.Executed:
			keep[s.Attestation] = true
		case record.Suspended:
			keep[s.Manifest] = true
			for _, a := range s.Snapshot.Addresses() {
				keep[a] = true
			}
		}
	}
	// Receipts and journals: everything that is neither a unit, a grant
	// set, an attestation, a manifest nor a transcript of another run is
	// kept when an attestation kept names it.
	for _, o := range all.Objects {
		if keep[o.Addr] && bytes.HasPrefix(o.Bytes, []byte("runrecordd.signed-attestation/1")) {
			for _, p := range all.Objects {
				if bytes.Contains(o.Bytes, p.Addr[:]) {
					keep[p.Addr] = true
				}
			}
		}
	}
	for _, o := range all.Objects {
		if keep[o.Addr] {
			out.Objects = append(out.Objects, o)
		}
	}
	return out
}

func importRaw(d *daemon, raw []byte, id string) (api.Import, error) {
	return d.c.Import(context.Background(), bytes.NewReader(raw), id)
}

// TestAttackBundles imports hostile bundles, each a finding of docs/trust.md
// ("Bundles and host keys"): every one is refused with its typed error,
// and leaves the host as it was — no run, no object, no call, nothing
// staged — and the daemon serving. Each is built from real bundles of runs
// this daemon parked (signed by its own key, which it trusts), changed as
// an attacker would; or forged whole with a key of the attacker's.
func TestAttackBundles(t *testing.T) {
	privileged(t)
	d := mustDaemon(t, "bundles")
	waitImageParks(t, d) // its probe done before the test ends, fast as it is
	mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	ctx := context.Background()
	// Two parked transcript runs of different units: x and y.
	export := func(id, env string) *bundletest.Bundle {
		trStart(t, d, id, trAgentImage, "STEPS=2", env)
		trParked(t, d, id, 2)
		var buf bytes.Buffer
		if err := d.c.Export(ctx, id, &buf); err != nil {
			t.Fatalf("export %s: %v", id, err)
		}
		return readBundle(t, buf.Bytes())
	}
	x, y := export("x", "WHO=x"), export("y", "WHO=y")
	xs, ys := x.Record.Segment(1), y.Record.Segment(1)
	if x.Record.Len() != 2 || xs.Kind != record.Suspended || x.Record.Genesis() == y.Record.Genesis() {
		t.Fatalf("x %d segments, y %d", x.Record.Len(), y.Record.Len())
	}

	for _, c := range []struct {
		name string
		tar  func(t *testing.T) []byte
		code string
		why  string
	}{{
		// Finding 3: a bundle from anyone, with calls for the platform.
		name: "ForgedByAnUntrustedKey", code: api.CodeUntrustedSigner,
		tar: func(t *testing.T) []byte {
			_, key, _ := ed25519.GenerateKey(nil)
			b, err := bundletest.Run{
				Spec:   unit.Spec{Image: trAgentImage, ImageDigest: trAgentDigest, Mode: unit.TranscriptMode},
				Grants: unit.Grants{Network: unit.NoNetwork}, Key: key, Legacy: true, Transcript: []byte("{}\n"),
				Calls: []protocol.Call{{ID: "forged-call", Kind: "payment", Payload: json.RawMessage(`{"to":"attacker"}`)}},
			}.Forge("forged")
			if err != nil {
				t.Fatal(err)
			}
			return b.Tar(nil)
		},
	}, {
		// Finding 3: y's signed interval and park spliced under x's unit.
		name: "AttestationSplicedFromAnotherRun", code: api.CodeRecordInvalid, why: "genesis",
		tar: func(t *testing.T) []byte {
			return rebuilt(t, y, x.Record.Unit(), x.Record.Grants(), []record.Segment{y.Record.Segment(0), ys},
				x.Object(x.Record.Unit()), x.Object(x.Record.Grants())).Tar(nil)
		},
	}, {
		// Finding 3: y's signed interval, then a snapshot of the
		// attacker's: the tail no attestation's previous head reaches.
		name: "SnapshotSwappedAfterTheLastAttestation", code: api.CodeRecordInvalid, why: "suspended segment",
		tar: func(t *testing.T) []byte {
			evil := []byte("{\"attacker\":\"transcript\"}\n")
			swapped := record.Suspension(record.TranscriptSnapshot(record.Sum(evil)), ys.Manifest)
			return rebuilt(t, y, y.Record.Unit(), y.Record.Grants(), []record.Segment{y.Record.Segment(0), swapped}, evil).Tar(nil)
		},
	}, {
		// Finding 3: an empty manifest matches any host.
		name: "EmptyManifest", code: api.CodeBadRequest, why: "lacks keys",
		tar: func(t *testing.T) []byte {
			empty, _ := manifest.Manifest{}.Canonical()
			return rebuilt(t, x, x.Record.Unit(), x.Record.Grants(),
				[]record.Segment{x.Record.Segment(0), record.Suspension(xs.Snapshot, record.Sum(empty))}, empty).Tar(nil)
		},
	}, {
		// Finding 3: grants that mount the host's root.
		name: "GrantsMountTheHostRoot", code: api.CodeGrantRefused, why: "the host's root is never granted",
		tar: func(t *testing.T) []byte {
			g, err := unit.DecodeGrants(x.Object(x.Record.Grants()))
			if err != nil {
				t.Fatal(err)
			}
			g.ReadOnly = []unit.Mount{{Source: "/", Target: "/host"}}
			gb := g.Encode() // no host grants /: Canonical would refuse it
			return rebuilt(t, x, x.Record.Unit(), record.Sum(gb), []record.Segment{x.Record.Segment(0), xs}, gb).Tar(nil)
		},
	}, {
		// Finding 4: a sparse member that reads as 256 MiB from a few KiB.
		name: "SparseMember", code: api.CodeBadRequest, why: "sparse",
		tar: func(t *testing.T) []byte {
			const size = 256 << 20
			return x.Tar(func(h *bundle.Header) { h.Objects++; h.Bytes += size },
				bundletest.Sparse(bundletest.Name(bundletest.Zeros(size)), size))
		},
	}, {
		// Finding 4: an object the record does not reach.
		name: "ObjectTheRecordDoesNotReach", code: api.CodeBadRequest, why: "not one the record reaches",
		tar: func(t *testing.T) []byte {
			return x.Tar(func(h *bundle.Header) { h.Objects++; h.Bytes += 1 << 20 },
				bundletest.Member(bundletest.Name(bundletest.Zeros(1<<20)), make([]byte, 1<<20)))
		},
	}, {
		// Finding 4: members larger than bundle.json declares.
		name: "MembersLargerThanDeclared", code: api.CodeBadRequest, why: "declares",
		tar: func(t *testing.T) []byte {
			return x.Tar(func(h *bundle.Header) { h.Bytes = 16 })
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			raw := c.tar(t)
			was := stateOf(t, d)
			id := "attack-" + strings.ToLower(c.name)
			im, err := importRaw(d, raw, id)
			t.Logf("import of %d bytes of bundle: %v", len(raw), err)
			untouched(t, d, was)
			ae := apiError(t, err, c.code)
			if im.Run.ID != "" || !strings.Contains(ae.Message, c.why) {
				t.Fatalf("import: %+v, %v; want %s mentioning %q", im, err, c.code, c.why)
			}
			if _, err := d.c.Show(ctx, id); err == nil {
				t.Fatal("the refused bundle's run exists")
			}
		})
	}

	// The untrusted signer is named, and verify reports each signer.
	t.Run("SignersReported", func(t *testing.T) {
		h, err := d.c.Host(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v, err := d.c.Verify(ctx, "x")
		if err != nil || !v.OK || len(v.Signers) != 1 || v.Signers[0].Key != h.KeyID || !v.Signers[0].Trusted || v.Signers[0].Interval != 1 {
			t.Fatalf("verify x: %+v, %v", v, err)
		}
	})
}

// TestAttackBundleGrantPolicy: grants from a bundle are a request. A run
// on A mounts a directory read-only; its bundle is refused by a host that
// allows no mounts from bundles (the default) and by one whose
// --bundle-mount-allow does not cover the source, naming the mount; a
// host whose allow-list covers it imports the run and shows the grants.
func TestAttackBundleGrantPolicy(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	data, err := os.MkdirTemp("", "rre-data-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	a := mustDaemon(t, "policy-a")
	waitImageParks(t, a)
	mustImportImage(t, a, trAgentArchive, trAgentImage, trAgentDigest)
	const id = "mounts"
	if _, err := a.c.Start(ctx, api.RunRequest{ID: id,
		Unit: unit.Spec{Image: trAgentImage, Env: []string{"STEPS=2"}, Mode: unit.TranscriptMode},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 128 << 20, Network: unit.NoNetwork,
			ReadOnly: []unit.Mount{{Source: data, Target: "/data"}}}}); err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, a, id)
	trParked(t, a, id, 2)
	var raw bytes.Buffer
	if err := a.c.Export(ctx, id, &raw); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name, allow string
		refused     bool
	}{{"none", "", true}, {"elsewhere", filepath.Dir(data) + "/other", true}, {"covered", filepath.Dir(data), false}} {
		t.Run(c.name, func(t *testing.T) {
			var opts []func(*daemon)
			if c.allow != "" {
				opts = append(opts, func(d *daemon) { d.flags = []string{"--bundle-mount-allow", c.allow} })
			}
			b := mustDaemon(t, "policy-"+c.name, opts...)
			waitImageParks(t, b)
			trustHost(t, a, b)
			was := stateOf(t, b)
			im, err := importRaw(b, raw.Bytes(), "")
			if !c.refused {
				if err != nil || len(im.Grants.ReadOnly) != 1 || im.Grants.ReadOnly[0].Source != data || len(im.Signers) != 1 || !im.Signers[0].Trusted {
					t.Fatalf("import with %s allowed: %+v, %v", c.allow, im, err)
				}
				return
			}
			t.Logf("import with %q allowed: %v", c.allow, err)
			untouched(t, b, was)
			ae := apiError(t, err, api.CodeGrantRefused)
			if !strings.Contains(ae.Message, data+":/data") {
				t.Fatalf("the refusal does not name the mount: %v", ae)
			}
		})
	}
}
