package criu

import (
	"context"
	"testing"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
)

// sandboxSpec is the OCI spec containerd's defaults make, with what the
// executor adds that the images show: its own network namespace,
// no_new_privs and the default seccomp profile.
func sandboxSpec(t testing.TB) *specs.Spec {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "unit"},
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/run/netns/unit"}),
		oci.WithNoNewPrivileges, seccomp.WithDefaultProfile())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustPolicy(t testing.TB) Policy {
	t.Helper()
	p, err := PolicyOf(sandboxSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOracleImages: the images of a real park (the e2e oracle, CRIU
// 4.2.1, pages left out) pass under the policy of the spec it ran under.
func TestOracleImages(t *testing.T) {
	im, err := Read("testdata/oracle")
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Judge(mustPolicy(t)); err != nil {
		t.Fatal(err)
	}
}

// TestOwnTimeNamespace: a unit parked after a resume is in a time
// namespace of its own (CRIU makes one at every restore); it passes.
func TestOwnTimeNamespace(t *testing.T) {
	dir := oracle(t)
	for _, n := range []string{"ids-1.img", "ids-12.img"} {
		rewrite(t, dir, n, &criucore.TaskKobjIdsEntry{}, func(m *criucore.TaskKobjIdsEntry) { m.TimeNsId = proto.Uint32(14) })
	}
	if err := check(t, dir); err != nil {
		t.Fatal(err)
	}
}
