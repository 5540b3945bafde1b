package bundletest

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Read parses a bundle of either format without judging it, as a test
// looks into what an exporter wrote: bundle.json, the record, and every
// object in the order the bundle carries it, an objects/ member's or a
// packed one's alike. Only [bundle.Stage] judges a bundle.
func Read(raw []byte) (*Bundle, bundle.Header, error) {
	var h bundle.Header
	b := &Bundle{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		m, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return b, h, nil
		}
		if err != nil {
			return nil, h, err
		}
		switch {
		case m.Name == "bundle.json":
			err = json.NewDecoder(tr).Decode(&h)
			b.Run = h.Run
		case m.Name == "record.json":
			var wire []byte
			if wire, err = io.ReadAll(tr); err == nil {
				b.Record, err = record.DecodeWire(wire)
			}
		case strings.HasPrefix(m.Name, "pack/"):
			err = bundle.ReadPack(tr, m.Size, func(p []byte) error { b.add(bytes.Clone(p)); return nil })
		case strings.HasPrefix(m.Name, "objects/"):
			var p []byte
			if p, err = io.ReadAll(tr); err == nil {
				b.add(p)
			}
		default:
			err = fmt.Errorf("bundletest: member %q", m.Name)
		}
		if err != nil {
			return nil, h, fmt.Errorf("bundletest: %s: %w", m.Name, err)
		}
	}
}

// add appends an object as it came, a second time too.
func (b *Bundle) add(p []byte) { b.Objects = append(b.Objects, Object{record.Sum(p), p}) }
