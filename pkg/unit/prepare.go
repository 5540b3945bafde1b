package unit

import "fmt"

// Prepared is a run request's unit and grant set made ready to run, with
// the canonical bytes whose addresses the run's genesis names.
type Prepared struct {
	Spec        Spec
	Grants      Grants
	SpecBytes   []byte
	GrantsBytes []byte
}

// Prepare makes a run request's unit and grants ready to run, in order:
// the defaults (image mode, no network); a nonce drawn here, since every
// run's genesis is its own (a request that brings one is refused); the
// image's digest from pin, which refuses an image that is not there or
// not the one the spec names; then both are validated. Refusals wrap
// ErrInvalid, or pin's error.
func Prepare(spec Spec, grants Grants, pin func(Spec) (digest string, err error)) (Prepared, error) {
	if spec.Mode == 0 {
		spec.Mode = ImageMode
	}
	if grants.Network == 0 {
		grants.Network = NoNetwork
	}
	if spec.Image == "" {
		return Prepared{}, fmt.Errorf("%w: the unit names no image", ErrInvalid)
	}
	if spec.Nonce != "" {
		return Prepared{}, fmt.Errorf("%w: the unit's nonce is the daemon's to draw, not the request's", ErrInvalid)
	}
	nonce, err := NewNonce()
	if err != nil {
		return Prepared{}, err
	}
	spec.Nonce = nonce
	if spec.ImageDigest, err = pin(spec); err != nil {
		return Prepared{}, err
	}
	if err := spec.Validate(); err != nil {
		return Prepared{}, err
	}
	if err := grants.Validate(); err != nil {
		return Prepared{}, err
	}
	p := Prepared{Spec: spec, Grants: grants}
	if p.SpecBytes, err = spec.Canonical(); err != nil {
		return Prepared{}, err
	}
	if p.GrantsBytes, err = grants.Canonical(); err != nil {
		return Prepared{}, err
	}
	return p, nil
}
