package criu

import (
	"errors"
	"fmt"
)

// ErrRefused is an image directory this host refuses to restore: an image
// that does not decode, breaks a limit, is of a kind no restore here
// reads, or grants more than the run's unit spec and grant set
// ([RefusedError] says which task and field). The API's image_refused.
var ErrRefused = errors.New("criu: image refused")

// RefusedError is a refusal of one image: the task it concerns (its pid
// in the images; 0 for an image of no one task), the image file and the
// field, and why.
type RefusedError struct {
	Task  uint32
	Image string // the image file's name
	Field string // the field, as CRIU's images/*.proto name it (creds.cap_eff)
	Why   string
}

func (e *RefusedError) Error() string {
	who := ""
	if e.Task != 0 {
		who = fmt.Sprintf("task %d: ", e.Task)
	}
	field := ""
	if e.Field != "" {
		field = e.Field + ": "
	}
	return fmt.Sprintf("%v: %s%s: %s%s", ErrRefused, who, e.Image, field, e.Why)
}

func (e *RefusedError) Unwrap() error { return ErrRefused }

// refuse is a RefusedError.
func refuse(task uint32, image, field, why string, args ...any) *RefusedError {
	return &RefusedError{Task: task, Image: image, Field: field, Why: fmt.Sprintf(why, args...)}
}
