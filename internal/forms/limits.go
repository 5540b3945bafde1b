package forms

import "time"

// ParkLimits bound an image park (serve --criu-deadline and --min-free).
type ParkLimits struct {
	// CRIUDeadline bounds every CRIU dump and restore; 0 derives it from
	// the memory moved (imageparks.Deadline).
	CRIUDeadline time.Duration
	// MinFree is the free space an image park must leave on the store's
	// filesystem (park.DefaultMinFree when 0).
	MinFree uint64
}
