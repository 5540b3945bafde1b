// Package manifest is the environment manifest: the host facts a resume
// depends on, as a sealed object. A park records the manifest's address;
// a resume judges this host against the recorded manifest key by key
// ([Judge]), each key by its rule ([RuleOf]): must match, must hold every
// recorded CPU flag, or judged by the image-park probe. The failures name
// the keys.
//
// Canonical bytes: the domain "runrecordd.manifest/N" (N the format, 1 or
// 2: [Manifest.Version]), a 4-byte entry count, then the entries sorted by
// key, each a 4-byte key length, the key, a 4-byte value length and the
// value. All integers big-endian. Keys are unique; docs/manifest.md lists
// them and their rules.
package manifest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Domain starts a manifest's canonical bytes, followed by its format's
// digit: Domain+"1" or Domain+"2".
const Domain = "runrecordd.manifest/"

// The formats this host reads. Format 1 is the one before the per-key
// rules: it records the CPU as cpu.features, a hash of its flags, and has
// no criu.images; format 2 records cpu.flags, the flags themselves. A
// manifest is of format 2 exactly when it names criu.images.
const (
	Format1 = 1
	Format2 = 2
)

// The keys a manifest may name. Image parks name all but Protocol;
// transcript parks name only Arch, ImageDigest and Protocol.
const (
	KernelRelease     = "kernel.release"
	Arch              = "arch"
	CPUFeatures       = "cpu.features"
	CPUFlags          = "cpu.flags"
	CRIUImages        = "criu.images"
	CRIUVersion       = "criu.version"
	RuncVersion       = "runc.version"
	ContainerdVersion = "containerd.version"
	ImageDigest       = "image.digest"
	UnitID            = "unit.id"
	Protocol          = "transcript.protocol"
)

// ImageKeys are the keys an image park records.
var ImageKeys = []string{KernelRelease, Arch, CPUFlags, CRIUImages, CRIUVersion, RuncVersion, ContainerdVersion, ImageDigest, UnitID}

// imageKeys1 are the keys a format-1 image park recorded.
var imageKeys1 = []string{KernelRelease, Arch, CPUFeatures, CRIUVersion, RuncVersion, ContainerdVersion, ImageDigest, UnitID}

// TranscriptKeys are the keys a transcript park records.
var TranscriptKeys = []string{Arch, ImageDigest, Protocol}

// KeysFor returns the keys a park of the given form records now: a
// manifest without all of them says nothing about a host the resume
// relies on (an empty manifest matches every host).
func KeysFor(transcript bool) []string {
	if transcript {
		return TranscriptKeys
	}
	return ImageKeys
}

// Required returns the keys m must name to be judged as a park of the
// given form: [KeysFor], or for a format-1 image park, the keys format 1
// recorded.
func (m Manifest) Required(transcript bool) []string {
	if !transcript && m.Version() == Format1 {
		return imageKeys1
	}
	return KeysFor(transcript)
}

// Version is m's format: 2 when it names criu.images, else 1. It is a
// function of the keys, so that a manifest has one canonical encoding.
func (m Manifest) Version() int {
	if _, ok := m[CRIUImages]; ok {
		return Format2
	}
	return Format1
}

// Missing returns the keys of keys that m does not name, in keys' order.
func (m Manifest) Missing(keys []string) []string {
	var out []string
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// Errors.
var (
	ErrMalformed = errors.New("malformed manifest")
	// ErrFormat is a manifest of a format this host does not read (one
	// written by a newer runrecordd): it is refused, never guessed at.
	ErrFormat  = fmt.Errorf("%w: a format this host does not read (it reads %s1 and %s2)", ErrMalformed, Domain, Domain)
	ErrMissing = errors.New("host cannot supply manifest key")
)

// Manifest maps keys to values.
type Manifest map[string]string

// Canonical returns the manifest's canonical bytes.
func (m Manifest) Canonical() ([]byte, error) {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if k == "" || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: key %q", ErrMalformed, k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b := fmt.Appendf(nil, "%s%d", Domain, m.Version())
	b = binary.BigEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(m[k])))
		b = append(b, m[k]...)
	}
	return b, nil
}

// Address returns the address of the manifest's canonical bytes.
func (m Manifest) Address() (record.Address, error) {
	b, err := m.Canonical()
	if err != nil {
		return record.Address{}, err
	}
	return record.Sum(b), nil
}

// Keys returns the manifest's keys, sorted.
func (m Manifest) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Decode parses canonical bytes, accepting only what Canonical writes.
func Decode(b []byte) (Manifest, error) {
	if !bytes.HasPrefix(b, []byte(Domain)) {
		return nil, fmt.Errorf("%w: missing %q header", ErrMalformed, Domain)
	}
	if len(b) > len(Domain) && b[len(Domain)] != '1' && b[len(Domain)] != '2' {
		return nil, fmt.Errorf("%w: %q", ErrFormat, cutBytes(b, len(Domain)+8))
	}
	if len(b) < len(Domain)+5 {
		return nil, fmt.Errorf("%w: truncated header", ErrMalformed)
	}
	p := b[len(Domain)+1:]
	n := binary.BigEndian.Uint32(p)
	p = p[4:]
	str := func() (string, bool) {
		if len(p) < 4 {
			return "", false
		}
		l := binary.BigEndian.Uint32(p)
		if uint64(l) > uint64(len(p)-4) {
			return "", false
		}
		s := string(p[4 : 4+l])
		p = p[4+l:]
		return s, true
	}
	m := Manifest{}
	prev := ""
	for i := uint32(0); i < n; i++ {
		k, ok1 := str()
		v, ok2 := str()
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: truncated entry %d", ErrMalformed, i)
		}
		if i > 0 && k <= prev {
			return nil, fmt.Errorf("%w: keys out of order at %q", ErrMalformed, k)
		}
		prev = k
		m[k] = v
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(p))
	}
	again, err := m.Canonical()
	if err != nil || !bytes.Equal(again, b) {
		return nil, fmt.Errorf("%w: not canonical", ErrMalformed)
	}
	return m, nil
}

// Over returns this host's values for the given keys, taken from host. A
// key the host cannot supply is an error wrapping [ErrMissing].
func Over(keys []string, host Manifest) (Manifest, error) {
	out := Manifest{}
	var missing []string
	for _, k := range keys {
		v, ok := host[k]
		if !ok {
			missing = append(missing, k)
			continue
		}
		out[k] = v
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrMissing, strings.Join(missing, ", "))
	}
	return out, nil
}

// cutBytes is b's first n bytes at most, for an error.
func cutBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
