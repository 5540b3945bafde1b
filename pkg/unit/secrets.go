package unit

import (
	"fmt"
	"slices"
)

// secretsTag opens the secrets block of a grant set's bytes: present
// exactly when the grant set names a secret.
const secretsTag = 0x03

// Secret names: at most MaxSecrets in a grant set, each 1 to
// MaxSecretName bytes of A–Z, a–z, 0–9, '_', '.' and '-', not "." or
// "..". A name is the file a unit reads the value from (docs/unit.md).
const (
	MaxSecrets    = 32
	MaxSecretName = 64
)

// CheckSecretName reports whether s may name a secret.
func CheckSecretName(s string) error {
	if s == "" || len(s) > MaxSecretName || s == "." || s == ".." {
		return fmt.Errorf("%w: secret name %q: want 1 to %d bytes, not \".\" or \"..\"", ErrInvalid, s, MaxSecretName)
	}
	for _, c := range []byte(s) {
		ok := c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			return fmt.Errorf("%w: secret name %q: only A-Z, a-z, 0-9, '_', '.' and '-'", ErrInvalid, s)
		}
	}
	return nil
}

// checkSecrets reports whether names is a grant set's list of secret
// names: each valid, at most MaxSecrets, in ascending order, no two equal.
func checkSecrets(names []string) error {
	if len(names) > MaxSecrets {
		return fmt.Errorf("%w: %d secrets, at most %d", ErrInvalid, len(names), MaxSecrets)
	}
	for i, n := range names {
		if err := CheckSecretName(n); err != nil {
			return err
		}
		if i > 0 && names[i-1] >= n {
			return fmt.Errorf("%w: secret names not in ascending order without repeats: %q then %q", ErrInvalid, names[i-1], n)
		}
	}
	return nil
}

// SortSecrets puts names in the order a grant set keeps them (ascending
// bytes), dropping repeats.
func SortSecrets(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// secrets reads a secrets block's names after its tag.
func (d *decoder) secrets() []string {
	n := d.count(5) // a name is a length and at least one byte
	if n == 0 {
		d.fail("grants: a secrets block with no name")
		return nil
	}
	out := make([]string, 0, n)
	for range n {
		out = append(out, d.str())
	}
	return out
}
