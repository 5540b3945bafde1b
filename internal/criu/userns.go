package criu

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/userns"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
)

// A sandbox's user namespace maps its ids 0 up to a count of ids to a
// host range: one extent per map. CRIU restores the maps from the
// user namespace's image (userns-NSID.img), not from runc's spec, so the
// restore here puts this host's range into that image first ([Remap])
// and the judge then accepts exactly the spec's maps.

// idMapOf is the one extent of the spec's map m: in-namespace ids from
// 0, to a host range. A spec here never has another shape.
func idMapOf(which string, m []specs.LinuxIDMapping) (specs.LinuxIDMapping, error) {
	if len(m) != 1 || m[0].ContainerID != 0 || m[0].Size == 0 || uint64(m[0].HostID)+uint64(m[0].Size) > 1<<32 {
		return specs.LinuxIDMapping{}, fmt.Errorf("criu: an OCI spec whose %s mappings are not one extent from 0: %v", which, m)
	}
	return m[0], nil
}

// judgeUserns refuses images whose user namespaces are not the
// sandbox's: with one in the spec, exactly one image of the root task's
// user namespace whose maps are the spec's; without one, none.
func (im *Images) judgeUserns(root uint32, user uint32, p Policy) error {
	if !p.Namespaces[specs.UserNamespace] {
		for nsid := range im.Userns {
			return refuse(0, fmt.Sprintf("userns-%d.img", nsid), "", "a user namespace: the sandbox has none")
		}
		return nil
	}
	if len(im.Userns) == 0 {
		return refuse(root, "userns", "", "no user namespace in the images: a park made without one resumes only under --allow-host-root-images")
	}
	if len(im.Userns) > 1 {
		return refuse(0, "userns", "", "%d user namespaces, the sandbox has one", len(im.Userns))
	}
	name := fmt.Sprintf("userns-%d.img", user)
	u := im.Userns[user]
	if u == nil {
		return refuse(root, name, "", "missing: the images' user namespace is not the root task's (%d)", user)
	}
	for _, m := range []struct {
		field string
		got   []*userns.UidGidExtent
		want  specs.LinuxIDMapping
	}{{"uid_map", u.GetUidMap(), p.UIDMap}, {"gid_map", u.GetGidMap(), p.GIDMap}} {
		if len(m.got) != 1 {
			return refuse(root, name, m.field, "%d extents, the sandbox's map has one", len(m.got))
		}
		e := m.got[0]
		if e.GetFirst() != m.want.ContainerID || e.GetLowerFirst() != m.want.HostID || e.GetCount() != m.want.Size {
			return refuse(root, name, m.field, "%d %d %d, the run's map here is %d %d %d",
				e.GetFirst(), e.GetLowerFirst(), e.GetCount(), m.want.ContainerID, m.want.HostID, m.want.Size)
		}
	}
	return nil
}

// Remap puts the host range from hostBase, of count ids, into the user
// namespace image of the image directory dir: its one uid extent and its
// one gid extent, each of count ids from 0, get hostBase as their host
// side. A directory without exactly one such image, or with other maps,
// is refused (a [*RefusedError]). The image is replaced, never written
// in place: a restore's tree links the store's objects. It is not synced,
// as CRIU does not sync the images it writes: the directory is a
// checkpoint's, which its caller makes durable whole, or a restore's
// scratch copy.
func Remap(dir string, hostBase, count uint32) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, de := range des {
		if k, _, ok := kindOf(de.Name()); ok && k.prefix == "userns-" {
			names = append(names, de.Name())
		}
	}
	if len(names) != 1 {
		return refuse(0, "userns", "", "%d user namespace images, a sandbox's park has one", len(names))
	}
	name := names[0]
	path := filepath.Join(dir, name)
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() > MaxImage {
		return refuse(0, name, "", "not a regular file within %d bytes", MaxImage)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	k, _, _ := kindOf(name)
	es, err := frames(b, k.magic)
	if err != nil {
		return refuse(0, name, "", "%v", err)
	}
	if len(es) != 1 {
		return refuse(0, name, "", "%d entries, CRIU writes one", len(es))
	}
	u := &userns.UsernsEntry{}
	if err := proto.Unmarshal(es[0], u); err != nil {
		return refuse(0, name, "", "%v", err)
	}
	for _, m := range []struct {
		field string
		ext   []*userns.UidGidExtent
	}{{"uid_map", u.GetUidMap()}, {"gid_map", u.GetGidMap()}} {
		if len(m.ext) != 1 || m.ext[0].GetFirst() != 0 || m.ext[0].GetCount() != count {
			return refuse(0, name, m.field, "%s, a sandbox's map is one extent of %d ids from 0", extents(m.ext), count)
		}
		m.ext[0].LowerFirst = proto.Uint32(hostBase)
	}
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(u)
	if err != nil {
		return err
	}
	return atomicfile.WriteNoSync(path, 0o600, func(f *os.File) error {
		_, err := f.Write(frame(k.magic, out))
		return err
	})
}

// frame is an image of magic holding the one entry e.
func frame(magic uint32, e []byte) []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, 12+len(e)), imgCommon)
	b = binary.LittleEndian.AppendUint32(b, magic)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
	return append(b, e...)
}

// extents describes a map's extents for a refusal.
func extents(es []*userns.UidGidExtent) string {
	if len(es) == 0 {
		return "no extent"
	}
	var s []string
	for _, e := range es {
		s = append(s, fmt.Sprintf("%d %d %d", e.GetFirst(), e.GetLowerFirst(), e.GetCount()))
	}
	return strings.Join(s, ", ")
}
