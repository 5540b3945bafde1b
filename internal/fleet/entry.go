package fleet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// valueFormat is the "v" of every value the package writes.
const valueFormat = 1

// maxValue bounds a value read from etcd before it is decoded.
const maxValue = 4096

// maxName bounds a run id and a host name, in bytes (the store's run ids
// are 1–128 bytes too).
const maxName = 128

// Entry is a run's directory entry, as read at Rev.
type Entry struct {
	Genesis record.Address // the key: the run's genesis head
	Run     string         // the run's id on its owner (a name; informational)
	Owner   record.Address // key id of the owning host
	Lease   int64          // the owner's lease when it claimed; ownership lives while it does
	Head    record.Address // the head the owner may have reached (docs/fleet.md)
	Phase   record.Phase   // the phase at Head
	// Prev and PrevPhase are the head and phase before the last Advance,
	// so a reservation that was never appended can be taken back
	// ([Host.Revert]); zero when there is none.
	Prev      record.Address
	PrevPhase record.Phase
	// To is the host the owner transferred the run to, zero when none:
	// that host may claim it; the owner may no longer advance it.
	To  record.Address
	Rev int64 // etcd's mod revision of the entry
}

// Role is what an admitted key may do.
type Role string

// The roles of admitted keys. A key has one role: a platform key cannot
// act as a peer host, nor a host key as a platform.
const (
	RoleHost     Role = "host"
	RolePlatform Role = "platform"
)

// Member is an admitted key.
type Member struct {
	Key      record.Address
	Name     string
	Role     Role
	Admitted time.Time
	// Lease is the lease of the host's live session, 0 when it has none
	// (never joined, or its lease expired).
	Lease int64
	// Peer is where the live session serves the fleet (host:port of its
	// mutual-TLS listener), empty when it serves none.
	Peer string
	// Draining is set by a live session being drained (Host.Drain): it
	// takes no runs. It ends with the session.
	Draining bool
}

type entryJSON struct {
	V         int    `json:"v"`
	Run       string `json:"run"`
	Owner     string `json:"owner"`
	Lease     int64  `json:"lease"`
	Head      string `json:"head"`
	Phase     string `json:"phase"`
	Prev      string `json:"prev,omitempty"`
	PrevPhase string `json:"prev_phase,omitempty"`
	To        string `json:"to,omitempty"`
}

type memberJSON struct {
	V        int       `json:"v"`
	Name     string    `json:"name"`
	Role     Role      `json:"role"`
	Admitted time.Time `json:"admitted"`
}

func (e Entry) encode() []byte {
	j := entryJSON{V: valueFormat, Run: e.Run, Owner: e.Owner.String(), Lease: e.Lease,
		Head: e.Head.String(), Phase: e.Phase.String()}
	if !e.Prev.IsZero() {
		j.Prev, j.PrevPhase = e.Prev.String(), e.PrevPhase.String()
	}
	if !e.To.IsZero() {
		j.To = e.To.String()
	}
	b, _ := json.Marshal(j) // strings and numbers only: cannot fail
	return b
}

func decodeEntry(genesis record.Address, v []byte, rev int64) (Entry, error) {
	var j entryJSON
	if err := strictJSON(v, &j); err != nil {
		return Entry{}, fmt.Errorf("run %s: %w", genesis, err)
	}
	e := Entry{Genesis: genesis, Run: j.Run, Lease: j.Lease, Rev: rev}
	var err error
	fields := []struct {
		s        string
		a        *record.Address
		optional bool
	}{{j.Owner, &e.Owner, false}, {j.Head, &e.Head, false}, {j.Prev, &e.Prev, true}, {j.To, &e.To, true}}
	for _, f := range fields {
		if f.s == "" && f.optional {
			continue
		}
		if *f.a, err = record.ParseAddress(f.s); err != nil {
			return Entry{}, fmt.Errorf("run %s: %w: %v", genesis, ErrEntry, err)
		}
	}
	if e.Phase, err = parsePhase(j.Phase); err != nil {
		return Entry{}, fmt.Errorf("run %s: %w", genesis, err)
	}
	if j.Prev != "" {
		if e.PrevPhase, err = parsePhase(j.PrevPhase); err != nil {
			return Entry{}, fmt.Errorf("run %s: %w", genesis, err)
		}
	}
	if j.V != valueFormat || e.Lease == 0 || checkName(j.Run) != nil {
		return Entry{}, fmt.Errorf("run %s: %w: format %d, lease %d, run %q", genesis, ErrEntry, j.V, j.Lease, j.Run)
	}
	return e, nil
}

func (m Member) encode() []byte {
	b, _ := json.Marshal(memberJSON{V: valueFormat, Name: m.Name, Role: m.Role, Admitted: m.Admitted.UTC()})
	return b
}

func decodeMember(key record.Address, v []byte) (Member, error) {
	var j memberJSON
	if err := strictJSON(v, &j); err != nil {
		return Member{}, fmt.Errorf("host %s: %w", key, err)
	}
	if j.V != valueFormat || checkRole(j.Role) != nil || checkName(j.Name) != nil {
		return Member{}, fmt.Errorf("host %s: %w: format %d, role %q, name %q", key, ErrEntry, j.V, j.Role, j.Name)
	}
	return Member{Key: key, Name: j.Name, Role: j.Role, Admitted: j.Admitted}, nil
}

// strictJSON decodes one bounded JSON object with no unknown fields.
func strictJSON(v []byte, dst any) error {
	if len(v) > maxValue {
		return fmt.Errorf("%w: %d bytes", ErrEntry, len(v))
	}
	d := json.NewDecoder(bytes.NewReader(v))
	d.DisallowUnknownFields()
	if err := d.Decode(dst); err != nil {
		return fmt.Errorf("%w: %v", ErrEntry, err)
	}
	if d.More() {
		return fmt.Errorf("%w: trailing data", ErrEntry)
	}
	return nil
}

func parsePhase(s string) (record.Phase, error) {
	for _, p := range []record.Phase{record.PhaseExecuting, record.PhaseParked, record.PhaseClosed} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: phase %q", ErrEntry, s)
}

// checkName accepts a run id or host name: 1–128 bytes of UTF-8 with no
// control characters.
func checkName(s string) error {
	if s == "" || len(s) > maxName || !utf8.ValidString(s) {
		return fmt.Errorf("name %q: 1 to %d bytes of UTF-8", s, maxName)
	}
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return fmt.Errorf("name %q: control character", s)
		}
	}
	return nil
}

func checkRole(r Role) error {
	if r != RoleHost && r != RolePlatform {
		return fmt.Errorf("%w: role %q (host or platform)", ErrNotAdmitted, r)
	}
	return nil
}
