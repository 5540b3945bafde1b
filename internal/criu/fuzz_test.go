package criu

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecodeImages decodes and judges the oracle's image directory with
// one image (the which-th, by name) replaced by the fuzzer's bytes,
// seeded with each real image: it never panics, and what it refuses
// wraps ErrRefused. What it passes is narrowed under a unit's limits.
func FuzzDecodeImages(f *testing.F) {
	des, err := os.ReadDir("testdata/oracle")
	if err != nil {
		f.Fatal(err)
	}
	names := make([]string, len(des))
	oracle := make([][]byte, len(des))
	for i, de := range des {
		names[i] = de.Name()
		if oracle[i], err = os.ReadFile(filepath.Join("testdata/oracle", de.Name())); err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), oracle[i])
	}
	p := mustPolicy(f)
	unit := mustPolicy(f)
	unitLimits(&unit)
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		w := int(which) % len(names)
		im := newImages()
		var err error
		for i, name := range names {
			img := oracle[i]
			if i == w {
				img = b
			}
			if err = im.addFile(name, img); err != nil {
				break
			}
		}
		if err == nil {
			err = im.Judge(p)
		}
		if err == nil {
			err = im.Narrow(t.TempDir(), unit)
		}
		if err != nil && !errors.Is(err, ErrRefused) {
			t.Fatalf("%s: %v does not wrap ErrRefused", names[w], err)
		}
	})
}
