//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A sandbox with a user namespace ([Spec.UserNS]) maps its ids 0 up to
// idmap.Size-1 to its run's host range; its unit is root only in there.
//
//   - runc makes the network namespace inside the user namespace (the
//     spec's network namespace has no path): CRIU can dump and restore
//     it. No pin of the executor's (netns_linux.go): runc's restore
//     always gives CRIU --empty-ns net and restores it empty, so the
//     namespace is configured by a createRuntime hook (netHook) that runc
//     runs both when it makes the container and at CRIU's
//     setup-namespaces, before any socket is restored.
//   - The rootfs is the image's layers seen in the range's ids
//     (remappedSnapshot): idmapped where the snapshotter can, else a
//     chowned copy per image and range. Its rw layer holds host ids;
//     the checkpoint's layer tar is translated to in-namespace ids as it
//     is written, and back to the range's as a restore applies it
//     (shiftTar), so no host id leaves the host.
//   - The images hold the range in userns-N.img only: a checkpoint
//     rewrites it to host base 0 there, a restore to its own range in
//     its staged copy of the images (stageImages), before the images
//     are judged.
//   - A lazy restore's usernsd opens /dev/userfaultfd (CRIU patch 5)
//     from inside the sandbox's cgroup: the devices rule c 10:257 rw
//     lets it. The unit gets no node of it and cannot make one.

// netHook is the createRuntime hook of a sandbox with a user namespace:
// it reads the container's pid from the OCI state on stdin and, in its
// network namespace, sets MPTCP off (CRIU cannot dump an MPTCP socket)
// and, when $1 is "up" or "egress", loopback up; with "egress" it then
// asks the daemon to link the namespace out (link.go): it writes the pid
// to the FIFO $2/pid and waits for "ok" on $2/ack. Loopback "down" is
// left as a new
// network namespace has it: runc makes one for the container, and CRIU
// one for its restore. Shell builtins only up to nsenter, which execs the
// shell (and that ip) in the namespace: runc runs the hook at every
// create and restore, and each process made costs one more wait for the
// CPU on a loaded host.
const netHook = `s=
while IFS= read -r l || [ -n "$l" ]; do s=$s$l; done
pid=${s#*'"pid":'}
pid=${pid#"${pid%%[! ]*}"}
pid=${pid%%[!0-9]*}
case $s in *'"pid":'*) [ -n "$pid" ] ;; *) false ;; esac || { echo "no pid in the OCI state" >&2; exit 1; }
mptcp='[ ! -e /proc/sys/net/mptcp/enabled ] || echo 0 > /proc/sys/net/mptcp/enabled'
case $1 in
up) exec nsenter -t "$pid" -n sh -c "$mptcp && exec ip link set lo up" ;;
egress) nsenter -t "$pid" -n sh -c "$mptcp && exec ip link set lo up" || exit 1
	echo "$pid" > "$2/pid" && read -r ok < "$2/ack" && [ "$ok" = ok ] || { echo "the sandbox was not linked out" >&2; exit 1; } ;;
*) exec nsenter -t "$pid" -n sh -c "$mptcp" ;;
esac`

// usernsOpts are the OCI spec's parts of a sandbox whose user namespace
// maps to r, its loopback as network says; with network egress the hook
// asks for its link through the FIFOs in linkDir.
func usernsOpts(r idmap.Range, network unit.Network, linkDir string) []oci.SpecOpts {
	maps := []specs.LinuxIDMapping{{ContainerID: 0, HostID: r.Base, Size: idmap.Size}}
	args := []string{"sh", "-c", netHook, "netns-hook", "down"}
	switch network {
	case unit.Loopback:
		args[4] = "up"
	case unit.Egress:
		args[4] = "egress"
		args = append(args, linkDir)
	}
	timeout := linkTimeout
	return []oci.SpecOpts{
		oci.WithUserNamespace(maps, maps),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace}),
		func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			if s.Hooks == nil {
				s.Hooks = &specs.Hooks{}
			}
			s.Hooks.CreateRuntime = append(s.Hooks.CreateRuntime, specs.Hook{
				Path: "/bin/sh", Args: args, Timeout: &timeout,
			})
			if s.Linux.Resources == nil {
				s.Linux.Resources = &specs.LinuxResources{}
			}
			major, minor := int64(10), int64(257) // /dev/userfaultfd
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{
				Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rw",
			})
			return nil
		},
	}
}

// remappedSnapshot prepares snapshot id over img's layers seen in r's
// ids: where the snapshotter idmaps its layers (capability remap-ids),
// the image's own layers, labelled with r's maps, which its mounts then
// carry (the lower layers idmapped, the upper directory owned by r's
// base: nothing is copied); otherwise containerd's remapped snapshot, a
// copy of the layers chowned into r, made once per image and range.
func (c *Client) remappedSnapshot(ctx context.Context, id string, img containerd.Image, r idmap.Range) error {
	caps, err := c.client.GetSnapshotterCapabilities(ctx, Snapshotter)
	if err != nil {
		return err
	}
	if !slices.Contains(caps, "remap-ids") {
		return containerd.WithRemappedSnapshot(id, img, r.Base, r.Base)(ctx, c.client, &containers.Container{ID: id, Snapshotter: Snapshotter})
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return fmt.Errorf("image layers: %w", err)
	}
	_, err = c.client.SnapshotService(Snapshotter).Prepare(ctx, id, identity.ChainID(diffIDs).String(),
		containerd.WithRemapperLabels(0, r.Base, 0, r.Base, idmap.Size))
	return err
}

// userBase is the host base of the sandbox's user namespace, and whether
// it has one, from its container's spec.
func (s *Sandbox) userBase(ctx context.Context) (uint32, bool, error) {
	spec, err := s.cont.Spec(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("the container's spec: %w", err)
	}
	if spec.Linux == nil || len(spec.Linux.UIDMappings) == 0 {
		return 0, false, nil
	}
	m := spec.Linux.UIDMappings
	if len(m) != 1 || m[0].ContainerID != 0 || m[0].Size != idmap.Size {
		return 0, false, fmt.Errorf("%w: the container's uid map %v is not a sandbox's", ErrInvalid, m)
	}
	return m[0].HostID, true, nil
}

// stageImages is the image directory a restore into r reads: a new
// directory under work holding each file of images as the range's root
// owns it, whose user namespace image gets r's range (criu.Remap).
// images itself is never written: it may be sealed.
//
// CRIU opens the images, the pages too, in the restored task after it
// has taken the range's ids: the store's objects (root's, 0400) would
// refuse it. The pages, the bulk, are bound one by one through an
// idmapped mount (root's files seen as the range's base's; unstage
// detaches them); the other images, small, are copies owned by the base.
// The idmapped mount's user namespace (a child process, rangeUserns) is
// made while they are copied. The directory is searchable by all (an
// absent image's open must fail with ENOENT, not EACCES); the
// directories above it stay closed: CRIU holds it open.
func stageImages(images, work string, r idmap.Range) (_ string, err error) {
	dst := filepath.Join(work, "images")
	if err := os.Mkdir(dst, 0o700); err != nil {
		return "", err
	}
	// A staging refused after pages were bound leaves no mount behind.
	defer func() {
		if err != nil {
			err = errors.Join(err, unmountUnder(dst))
		}
	}()
	if err := os.Chmod(dst, 0o711); err != nil {
		return "", err
	}
	des, err := os.ReadDir(images)
	if err != nil {
		return "", err
	}
	if len(des) > criu.MaxFiles {
		return "", fmt.Errorf("%w: %d image files, the limit is %d", criu.ErrRefused, len(des), criu.MaxFiles)
	}
	var pages []string
	for _, de := range des {
		if !de.Type().IsRegular() {
			return "", &criu.RefusedError{Image: de.Name(), Why: "not a regular file"}
		}
		if strings.HasPrefix(de.Name(), "pages-") {
			pages = append(pages, de.Name())
		}
	}
	userns := make(chan usernsFile, 1)
	if len(pages) > 0 {
		go func() {
			f, err := rangeUserns(r)
			userns <- usernsFile{f, err}
		}()
	} else {
		userns <- usernsFile{}
	}
	got := false
	defer func() {
		if !got {
			if u := <-userns; u.f != nil {
				u.f.Close()
			}
		}
	}()
	for _, de := range des {
		if strings.HasPrefix(de.Name(), "pages-") {
			continue
		}
		// CRIU reads the time namespace's image in the new task before
		// its ids are mapped (it is the overflow id then): readable by
		// all. It holds clock offsets.
		mode := os.FileMode(0o400)
		if strings.HasPrefix(de.Name(), "timens-") {
			mode = 0o444
		}
		if err := copyFile(filepath.Join(images, de.Name()), filepath.Join(dst, de.Name()), r.Base, mode); err != nil {
			return "", err
		}
	}
	u := <-userns
	got = true
	if u.err != nil {
		return "", u.err
	}
	if u.f != nil {
		defer u.f.Close()
	}
	// The memory, the bulk: not copied but bound through an idmapped
	// mount, where the range's root owns it.
	for _, name := range pages {
		to := filepath.Join(dst, name)
		if err := os.WriteFile(to, nil, 0o400); err != nil {
			return "", err
		}
		if err := idmappedBind(filepath.Join(images, name), to, u.f); err != nil {
			return "", err
		}
	}
	if err := criu.Remap(dst, r.Base, idmap.Size); err != nil {
		return "", err
	}
	return dst, nil
}

// usernsFile is what rangeUserns returned.
type usernsFile struct {
	f   *os.File
	err error
}

// copyFile copies the file from to the new file to, owned by uid and gid
// owner, of mode.
func copyFile(from, to string, owner uint32, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Chown(int(owner), int(owner))
	}
	if err == nil {
		err = out.Chmod(mode)
	}
	return errors.Join(err, out.Close())
}

// Searchable makes directory dir searchable by every user (o+x, g+x),
// nothing more: runc sets up the rootfs of a sandbox with a user
// namespace as the range's root, an unprivileged user of the host, which
// must reach the bundle's rootfs through every directory above it. No
// directory is made readable, so nothing is listed; what lies below keeps
// its own modes.
func Searchable(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o011 == 0o011 {
		return nil
	}
	return os.Chmod(dir, fi.Mode().Perm()|0o011)
}

// ImagesUserNS reports whether the CRIU image directory dir holds a user
// namespace's image: a park made in a sandbox with a user namespace. (The
// images are judged all the same before a restore reads them.)
func ImagesUserNS(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, "userns-*.img"))
	return len(m) > 0
}
