package executor

import (
	"errors"
	"testing"
)

func TestAtLeast(t *testing.T) {
	for _, tc := range []struct {
		version string
		min     [2]int
		ok      bool
	}{
		{"v2.3.7", MinContainerd, true},
		{"2.3.7+unknown", MinContainerd, true},
		{"v2.0.0", MinContainerd, true},
		{"v10.1.0", MinContainerd, true},
		{"1.6.20~ds1", MinContainerd, false},
		{"1.7.30", MinContainerd, false},
		{"1.5.3", MinRunc, true},
		{"1.2.0-rc.1", MinRunc, true},
		{"1.1.5", MinRunc, false},
		{"1.1.15+ds1", MinRunc, false},
		{"0.9.9", MinRunc, false},
		{"", MinRunc, false},
		{"dev", MinContainerd, false},
		{"2x.0", MinContainerd, false},
		{"2", MinContainerd, false},
	} {
		err := atLeast("thing", tc.version, tc.min)
		if (err == nil) != tc.ok {
			t.Errorf("atLeast(%q, %v) = %v, want ok=%v", tc.version, tc.min, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrMissing) {
			t.Errorf("atLeast(%q): %v does not wrap ErrMissing", tc.version, err)
		}
	}
}
