// Package unit is what a run executes: a [Spec] (image, arguments,
// environment, mode) and the [Grants] it runs under (CPU and memory
// limits, network, read-only mounts). A run's unit_id and grants_id are the
// addresses of their canonical bytes, and the genesis head binds both, so a
// run continued with other grants is a new run.
//
// Canonical bytes: a domain string, then every field in order; integers are
// big-endian, strings and lists carry a 4-byte length or count in front.
// docs/unit.md gives the layouts. [DecodeSpec] and [DecodeGrants] accept
// only those bytes.
package unit

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Domains. A spec with a nonce is written under SpecDomain; one without,
// under SpecDomainV1 (records made before runs had nonces still decode and
// verify; the daemon makes no new one).
const (
	SpecDomain   = "runrecordd.unit/2"
	SpecDomainV1 = "runrecordd.unit/1"
	GrantsDomain = "runrecordd.grants/1"
)

// NonceLen is the length of a spec's nonce: 32 lowercase hex digits
// (16 random bytes).
const NonceLen = 32

// Errors returned by this package; test with errors.Is.
var (
	// ErrInvalid: a spec or grant set that cannot run.
	ErrInvalid = errors.New("invalid unit")
	// ErrMalformed: bytes that are not the canonical bytes of a spec or
	// grant set: another domain, a bad length, trailing bytes, or a
	// decoding that does not re-encode to the same bytes.
	ErrMalformed = errors.New("malformed unit bytes")
	// ErrSource: a mount source no grant may name (with ErrInvalid).
	ErrSource = errors.New("mount source never granted")
)

// Mode is how a unit parks.
type Mode uint8

// Modes.
const (
	ImageMode      Mode = 1 // parks by CRIU checkpoint
	TranscriptMode Mode = 2 // parks by its transcript
)

func (m Mode) String() string {
	switch m {
	case ImageMode:
		return "image"
	case TranscriptMode:
		return "transcript"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode parses "image" or "transcript".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "image", "":
		return ImageMode, nil
	case "transcript":
		return TranscriptMode, nil
	}
	return 0, fmt.Errorf("%w: mode %q: want image or transcript", ErrInvalid, s)
}

// MarshalText writes the mode's name ("" for the zero mode, which a request
// leaves to the daemon's default).
func (m Mode) MarshalText() ([]byte, error) {
	if m == 0 {
		return nil, nil
	}
	return []byte(m.String()), nil
}

// UnmarshalText reads a mode's name; "" is the zero mode.
func (m *Mode) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = 0
		return nil
	}
	v, err := ParseMode(string(b))
	*m = v
	return err
}

// Spec is a unit: an image by name and content digest, what to run in it,
// and how it parks.
type Spec struct {
	Image       string   `json:"image"`        // image name, as imported
	ImageDigest string   `json:"image_digest"` // the image's manifest digest, "sha256:…"
	Args        []string `json:"args"`         // argv; empty runs the image's entrypoint
	Env         []string `json:"env"`          // KEY=VALUE, in order
	Mode        Mode     `json:"mode"`
	// Nonce makes the spec, and so the run's genesis, unique to one run:
	// the daemon draws it (16 random bytes, hex) when the run starts, and
	// a request may not choose it. Empty only in specs of records made
	// before runs had nonces.
	Nonce string `json:"nonce,omitempty"`
}

// NewNonce draws a fresh nonce.
func NewNonce() (string, error) {
	var b [NonceLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// Network is a grant set's network.
type Network uint8

// Networks.
const (
	NoNetwork Network = 1 // an empty network namespace, not even loopback up
	Loopback  Network = 2 // a private namespace with loopback only
)

func (n Network) String() string {
	switch n {
	case NoNetwork:
		return "none"
	case Loopback:
		return "loopback"
	}
	return fmt.Sprintf("network(%d)", uint8(n))
}

// MarshalText writes the network's name ("" for the zero network, which a
// request leaves to the daemon's default).
func (n Network) MarshalText() ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	return []byte(n.String()), nil
}

// UnmarshalText reads a network's name; "" is the zero network.
func (n *Network) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*n = 0
		return nil
	}
	v, err := ParseNetwork(string(b))
	*n = v
	return err
}

// ParseNetwork parses "none" or "loopback".
func ParseNetwork(s string) (Network, error) {
	switch s {
	case "none", "":
		return NoNetwork, nil
	case "loopback":
		return Loopback, nil
	}
	return 0, fmt.Errorf("%w: network %q: want none or loopback", ErrInvalid, s)
}

// Mount is a read-only bind mount of a host path.
type Mount struct {
	Source string `json:"source"` // absolute host path
	Target string `json:"target"` // absolute path in the sandbox
}

// Grants is what a unit may use.
type Grants struct {
	MilliCPU    uint32  `json:"milli_cpu"`    // CPU limit in thousandths of a core; 0 = unlimited
	MemoryBytes uint64  `json:"memory_bytes"` // memory limit; 0 = the daemon's default (docs/limits.md)
	Network     Network `json:"network"`
	ReadOnly    []Mount `json:"read_only"` // read-only bind mounts
	Limits      Limits  `json:"limits"`    // caps; a zero field takes the daemon's default
}

// Limits caps what a unit may hold or make the daemon hold. A zero field
// asks for the daemon's default (DefaultLimits, docs/limits.md); a grant set
// that sets none has the canonical bytes it had before limits existed.
type Limits struct {
	Pids                 uint32 `json:"pids,omitempty"`                   // processes and threads in the sandbox
	LogBytes             uint64 `json:"log_bytes,omitempty"`              // stdout and stderr, each
	TranscriptBytes      uint64 `json:"transcript_bytes,omitempty"`       // the transcript's size
	ChannelConns         uint32 `json:"channel_conns,omitempty"`          // connections open at once on the channel
	ChannelInflightBytes uint64 `json:"channel_inflight_bytes,omitempty"` // unanswered request bytes held across the channel's connections
	IntervalCalls        uint32 `json:"interval_calls,omitempty"`         // calls dispatched in one interval
	IntervalPayloadBytes uint64 `json:"interval_payload_bytes,omitempty"` // append and dispatch payload bytes in one interval
	SnapshotBytes        uint64 `json:"snapshot_bytes,omitempty"`         // the run's snapshot images, all parks together
}

// DefaultLimits are the daemon's limits where a grant set leaves one zero.
var DefaultLimits = Limits{
	Pids:                 1024,
	LogBytes:             64 << 20,
	TranscriptBytes:      256 << 20,
	ChannelConns:         16,
	ChannelInflightBytes: 8 << 20,
	IntervalCalls:        4096,
	IntervalPayloadBytes: 256 << 20,
	SnapshotBytes:        16 << 30,
}

// IsZero reports whether l sets no limit.
func (l Limits) IsZero() bool { return l == Limits{} }

// Or returns l with each zero field taken from def.
func (l Limits) Or(def Limits) Limits {
	pick32 := func(a, b uint32) uint32 {
		if a != 0 {
			return a
		}
		return b
	}
	pick64 := func(a, b uint64) uint64 {
		if a != 0 {
			return a
		}
		return b
	}
	return Limits{
		Pids:                 pick32(l.Pids, def.Pids),
		LogBytes:             pick64(l.LogBytes, def.LogBytes),
		TranscriptBytes:      pick64(l.TranscriptBytes, def.TranscriptBytes),
		ChannelConns:         pick32(l.ChannelConns, def.ChannelConns),
		ChannelInflightBytes: pick64(l.ChannelInflightBytes, def.ChannelInflightBytes),
		IntervalCalls:        pick32(l.IntervalCalls, def.IntervalCalls),
		IntervalPayloadBytes: pick64(l.IntervalPayloadBytes, def.IntervalPayloadBytes),
		SnapshotBytes:        pick64(l.SnapshotBytes, def.SnapshotBytes),
	}
}

// limitsTag opens the optional limits block of a grant set's bytes.
const limitsTag = 0x01

// Validate reports whether s can run.
func (s *Spec) Validate() error {
	if s.Image == "" {
		return fmt.Errorf("%w: no image", ErrInvalid)
	}
	if !strings.HasPrefix(s.ImageDigest, "sha256:") || len(s.ImageDigest) != 71 {
		return fmt.Errorf("%w: image digest %q is not sha256:<64 hex>", ErrInvalid, s.ImageDigest)
	}
	if s.Mode != ImageMode && s.Mode != TranscriptMode {
		return fmt.Errorf("%w: %s", ErrInvalid, s.Mode)
	}
	if s.Nonce != "" {
		if len(s.Nonce) != NonceLen || strings.Trim(s.Nonce, "0123456789abcdef") != "" {
			return fmt.Errorf("%w: nonce %q is not %d lowercase hex digits", ErrInvalid, s.Nonce, NonceLen)
		}
	}
	for _, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrInvalid, e)
		}
	}
	for _, str := range append(append([]string{s.Image, s.ImageDigest}, s.Args...), s.Env...) {
		if !utf8.ValidString(str) || strings.ContainsRune(str, 0) {
			return fmt.Errorf("%w: %q is not text", ErrInvalid, str)
		}
	}
	return nil
}

// Validate reports whether g can be granted.
func (g *Grants) Validate() error {
	if g.Network != NoNetwork && g.Network != Loopback {
		return fmt.Errorf("%w: %s", ErrInvalid, g.Network)
	}
	if g.MemoryBytes != 0 && g.MemoryBytes < 4<<20 {
		return fmt.Errorf("%w: memory limit %d bytes is below 4 MiB", ErrInvalid, g.MemoryBytes)
	}
	for _, m := range g.ReadOnly {
		if !path.IsAbs(m.Source) || !path.IsAbs(m.Target) || path.Clean(m.Target) != m.Target || m.Target == "/" {
			return fmt.Errorf("%w: mount %s:%s: paths must be absolute and clean, and not /", ErrInvalid, m.Source, m.Target)
		}
		if err := CheckSource(m.Source); err != nil {
			return err
		}
	}
	return nil
}

// forbiddenSources are the host trees no grant may mount, nor any path in
// them: the kernel's interfaces (/proc reaches every process's root, /sys
// and /dev the hardware) and /run, where the host's daemons keep their
// sockets.
var forbiddenSources = []string{"/proc", "/sys", "/dev", "/run"}

// CheckSource reports whether a read-only mount may have host path p as
// its source, by the path alone: absolute and clean, not the host's root,
// and not in a forbidden tree (/proc, /sys, /dev, /run). The executor
// checks the path again once it has resolved its symlinks, and also
// refuses the daemon's state directory, a directory holding it, and
// anything that is not a directory or a regular file (docs/trust.md).
func CheckSource(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("%w: mount source %s: not an absolute clean path", ErrInvalid, p)
	}
	if p == "/" {
		return fmt.Errorf("%w: %w: mount source /: the host's root is never granted", ErrInvalid, ErrSource)
	}
	for _, f := range forbiddenSources {
		if p == f || strings.HasPrefix(p, f+"/") {
			return fmt.Errorf("%w: %w: mount source %s: nothing under %s is ever granted", ErrInvalid, ErrSource, p, f)
		}
	}
	return nil
}

// Canonical returns the spec's canonical bytes.
func (s *Spec) Canonical() ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if s.Nonce == "" {
		b := []byte(SpecDomainV1)
		b = appendStr(b, s.Image)
		b = appendStr(b, s.ImageDigest)
		b = appendList(b, s.Args)
		b = appendList(b, s.Env)
		return append(b, byte(s.Mode)), nil
	}
	b := []byte(SpecDomain)
	b = appendStr(b, s.Image)
	b = appendStr(b, s.ImageDigest)
	b = appendList(b, s.Args)
	b = appendList(b, s.Env)
	b = append(b, byte(s.Mode))
	return appendStr(b, s.Nonce), nil
}

// ID returns unit_id: the address of the spec's canonical bytes.
func (s *Spec) ID() (record.Address, error) {
	b, err := s.Canonical()
	if err != nil {
		return record.Address{}, err
	}
	return record.Sum(b), nil
}

// Canonical returns the grant set's canonical bytes.
func (g *Grants) Canonical() ([]byte, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return g.Encode(), nil
}

// Encode writes the grant set's layout without validating it: what a
// forged bundle would carry, for tests that check it is refused.
// Everything else uses Canonical.
func (g *Grants) Encode() []byte {
	b := []byte(GrantsDomain)
	b = binary.BigEndian.AppendUint32(b, g.MilliCPU)
	b = binary.BigEndian.AppendUint64(b, g.MemoryBytes)
	b = append(b, byte(g.Network))
	b = binary.BigEndian.AppendUint32(b, uint32(len(g.ReadOnly)))
	for _, m := range g.ReadOnly {
		b = appendStr(b, m.Source)
		b = appendStr(b, m.Target)
	}
	if l := g.Limits; !l.IsZero() {
		b = append(b, limitsTag)
		b = binary.BigEndian.AppendUint32(b, l.Pids)
		b = binary.BigEndian.AppendUint64(b, l.LogBytes)
		b = binary.BigEndian.AppendUint64(b, l.TranscriptBytes)
		b = binary.BigEndian.AppendUint32(b, l.ChannelConns)
		b = binary.BigEndian.AppendUint64(b, l.ChannelInflightBytes)
		b = binary.BigEndian.AppendUint32(b, l.IntervalCalls)
		b = binary.BigEndian.AppendUint64(b, l.IntervalPayloadBytes)
		b = binary.BigEndian.AppendUint64(b, l.SnapshotBytes)
	}
	return b
}

// ID returns grants_id: the address of the grant set's canonical bytes.
func (g *Grants) ID() (record.Address, error) {
	b, err := g.Canonical()
	if err != nil {
		return record.Address{}, err
	}
	return record.Sum(b), nil
}

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func appendList(b []byte, l []string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(l)))
	for _, s := range l {
		b = appendStr(b, s)
	}
	return b
}

// DecodeSpec parses a spec's canonical bytes. It accepts only bytes that
// [Spec.Canonical] writes: the spec must validate (else [ErrInvalid]) and
// re-encode to exactly b (else [ErrMalformed]).
func DecodeSpec(b []byte) (*Spec, error) {
	d := decoder{b: b, what: "spec"}
	v1 := bytes.HasPrefix(b, []byte(SpecDomainV1))
	if v1 {
		d.domain(SpecDomainV1)
	} else {
		d.domain(SpecDomain)
	}
	s := &Spec{Image: d.str(), ImageDigest: d.str(), Args: d.list(), Env: d.list(), Mode: Mode(d.byte1())}
	if !v1 {
		s.Nonce = d.str()
		if d.err == nil && s.Nonce == "" {
			d.fail("a %s spec has an empty nonce", SpecDomain)
		}
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	canon, err := s.Canonical()
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(canon, b) {
		return nil, fmt.Errorf("%w: spec does not re-encode to its bytes", ErrMalformed)
	}
	return s, nil
}

// DecodeGrants parses a grant set's canonical bytes. It accepts only bytes
// that [Grants.Canonical] writes: the grant set must validate (else
// [ErrInvalid]) and re-encode to exactly b (else [ErrMalformed]).
func DecodeGrants(b []byte) (*Grants, error) {
	d := decoder{b: b, what: "grants"}
	d.domain(GrantsDomain)
	g := &Grants{MilliCPU: d.u32(), MemoryBytes: d.u64(), Network: Network(d.byte1())}
	n := d.count(8) // a mount is at least two empty strings
	if n > 0 {
		g.ReadOnly = make([]Mount, 0, n)
	}
	for range n {
		g.ReadOnly = append(g.ReadOnly, Mount{Source: d.str(), Target: d.str()})
	}
	if d.err == nil && len(d.b) > 0 {
		if tag := d.byte1(); tag != limitsTag {
			d.fail("grants: limits block tag %#x, want %#x", tag, limitsTag)
		}
		g.Limits = Limits{Pids: d.u32(), LogBytes: d.u64(), TranscriptBytes: d.u64(),
			ChannelConns: d.u32(), ChannelInflightBytes: d.u64(), IntervalCalls: d.u32(),
			IntervalPayloadBytes: d.u64(), SnapshotBytes: d.u64()}
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	canon, err := g.Canonical()
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(canon, b) {
		return nil, fmt.Errorf("%w: grants do not re-encode to their bytes", ErrMalformed)
	}
	return g, nil
}

// decoder reads canonical fields; the first failure sticks and every
// later read returns zero values.
type decoder struct {
	b    []byte
	what string
	err  error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s: %s", ErrMalformed, d.what, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.fail("truncated: %d bytes wanted, %d left", n, len(d.b))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) domain(dom string) {
	if b := d.take(uint64(len(dom))); d.err == nil && string(b) != dom {
		d.err = fmt.Errorf("%w: %s: domain is not %q", ErrMalformed, d.what, dom)
	}
}

func (d *decoder) byte1() byte {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) str() string { return string(d.take(uint64(d.u32()))) }

// count reads a 4-byte count of items of at least least bytes each, refusing
// one the remaining bytes cannot hold before anything is allocated.
func (d *decoder) count(least uint64) uint32 {
	n := d.u32()
	if d.err == nil && uint64(n)*least > uint64(len(d.b)) {
		d.fail("%d items in %d bytes", n, len(d.b))
		return 0
	}
	return n
}

// list reads a counted list of strings; an empty list is nil.
func (d *decoder) list() []string {
	n := d.count(4)
	if n == 0 {
		return nil
	}
	l := make([]string, 0, n)
	for range n {
		l = append(l, d.str())
	}
	return l
}

func (d *decoder) finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}
