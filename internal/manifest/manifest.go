// Package manifest is the environment manifest: the host facts a resume
// depends on, as a sealed object. A park records the manifest's address;
// a resume recomputes this host's values over the keys the recorded
// manifest names and must hash to the same address. When it does not,
// [Diff] names the keys that differ.
//
// Canonical bytes: the domain "runrecordd.manifest/1", a 4-byte entry
// count, then the entries sorted by key, each a 4-byte key length, the key,
// a 4-byte value length and the value. All integers big-endian. Keys are
// unique; docs/manifest.md lists them.
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

// Domain starts a manifest's canonical bytes.
const Domain = "runrecordd.manifest/1"

// The keys a manifest may name. Image parks name all but Protocol;
// transcript parks name only Arch, ImageDigest and Protocol.
const (
	KernelRelease     = "kernel.release"
	Arch              = "arch"
	CPUFeatures       = "cpu.features"
	CRIUVersion       = "criu.version"
	RuncVersion       = "runc.version"
	ContainerdVersion = "containerd.version"
	ImageDigest       = "image.digest"
	UnitID            = "unit.id"
	Protocol          = "transcript.protocol"
)

// ImageKeys are the keys an image park records.
var ImageKeys = []string{KernelRelease, Arch, CPUFeatures, CRIUVersion, RuncVersion, ContainerdVersion, ImageDigest, UnitID}

// TranscriptKeys are the keys a transcript park records.
var TranscriptKeys = []string{Arch, ImageDigest, Protocol}

// KeysFor returns the keys a park of the given form must record: a
// manifest without all of them says nothing about a host the resume
// relies on (an empty manifest matches every host).
func KeysFor(transcript bool) []string {
	if transcript {
		return TranscriptKeys
	}
	return ImageKeys
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
	ErrMissing   = errors.New("host cannot supply manifest key")
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
	b := append([]byte(Domain), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(b[len(Domain):], uint32(len(keys)))
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
	if !bytes.HasPrefix(b, []byte(Domain)) || len(b) < len(Domain)+4 {
		return nil, fmt.Errorf("%w: missing %q header", ErrMalformed, Domain)
	}
	p := b[len(Domain):]
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

// Difference is one key whose recorded and current values differ.
type Difference struct {
	Key      string
	Recorded string
	Current  string // "" with Absent set when this host has no value
	Absent   bool
}

func (d Difference) String() string {
	if d.Absent {
		return fmt.Sprintf("%s: recorded %q, this host has none", d.Key, d.Recorded)
	}
	return fmt.Sprintf("%s: recorded %q, this host %q", d.Key, d.Recorded, d.Current)
}

// Diff returns the keys of recorded whose values on host differ, sorted.
func Diff(recorded, host Manifest) []Difference {
	var out []Difference
	for _, k := range recorded.Keys() {
		cur, ok := host[k]
		switch {
		case !ok:
			out = append(out, Difference{Key: k, Recorded: recorded[k], Absent: true})
		case cur != recorded[k]:
			out = append(out, Difference{Key: k, Recorded: recorded[k], Current: cur})
		}
	}
	return out
}
