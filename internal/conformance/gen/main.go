// Command gen writes the conformance vectors in testdata/conformance.
//
// Each case states the outcome its author intends; gen replays it against
// pkg/record and stops if the implementation disagrees, so a vector is never
// written from a behaviour nobody chose. Canonical pins are hex written out
// by hand here, not encoder output.
//
//	go run ./internal/conformance/gen [DIR]
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/runrecordd/runrecordd/internal/conformance"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func main() {
	dir, sample := "testdata/conformance", "testdata/records/sample.json"
	if len(os.Args) > 1 {
		dir, sample = os.Args[1], filepath.Join(os.Args[1], "sample.json")
	}
	if err := os.WriteFile(sample, sampleRecord(), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("wrote %s\n", sample)
	for _, c := range []conformance.Class{c6(), c14(), c15()} {
		if res := conformance.Run(c); !res.Passed() {
			log.Fatalf("%s: the implementation disagrees with the vectors: %s", c.Class, strings.Join(res.Failed, "; "))
		}
		b, err := json.MarshalIndent(c, "", "  ")
		if err != nil {
			log.Fatal(err)
		}
		name := filepath.Join(dir, strings.ToLower(c.Class)+".json")
		if err := os.WriteFile(name, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("wrote %s (%d cases)\n", name, len(c.Cases))
	}
}

// addr names a test object by a label, as a real host names objects by
// their bytes.
func addr(label string) record.Address { return record.Sum([]byte(label)) }

func ptr(a record.Address) *record.Address { return &a }

// builder records a case's steps, stating each outcome.
type builder struct {
	c conformance.Case
	r *record.Record
}

func newCase(name string) *builder {
	u, g := addr("unit:"+name), addr("grants:"+name)
	return &builder{c: conformance.Case{Name: name, Unit: u, Grants: g}, r: record.New(u, g)}
}

// ok appends a segment that must be accepted.
func (b *builder) ok(s record.Segment) *builder {
	h, err := b.r.Append(s)
	if err != nil {
		log.Fatalf("%s: step %d: %v", b.c.Name, len(b.c.Steps), err)
	}
	b.c.Steps = append(b.c.Steps, conformance.Step{Segment: s, Expect: "ok", Head: ptr(h)})
	return b
}

// refuse appends a segment that must be refused with the named error.
func (b *builder) refuse(s record.Segment, want string) *builder {
	b.c.Steps = append(b.c.Steps, conformance.Step{Segment: s, Expect: want})
	return b
}

func (b *builder) done() conformance.Case {
	b.c.Head = ptr(b.r.Head())
	return b.c
}

func image(name string) record.Snapshot {
	return record.ImageSnapshot(addr("root:"+name), ptr(addr("memory:"+name)))
}

func transcript(name string) record.Snapshot {
	return record.TranscriptSnapshot(addr("transcript:" + name))
}

func exec(n int) record.Segment { return record.Execution(addr(fmt.Sprintf("attestation:%d", n)), nil) }

func u64(v uint64) *uint64 { return &v }

func intp(v int) *int { return &v }

// sampleRecord is a finished run in wire form: an image park, then a
// transcript park waiting on a call, resolved after resuming.
func sampleRecord() []byte {
	b := newCase("sample").
		ok(record.Execution(addr("attestation:1"), &record.CallAccount{})).
		ok(record.Suspension(image("s"), addr("manifest:s"))).
		ok(record.Resumption(image("s"), 2_000_000, record.Estimated)).
		ok(record.Execution(addr("attestation:2"), &record.CallAccount{Dispatched: []string{"review-1"}})).
		ok(record.Suspension(transcript("s"), addr("manifest:t"))).
		ok(record.Resumption(transcript("s"), 3_000, record.Estimated)).
		ok(record.Execution(addr("attestation:3"), &record.CallAccount{Resolved: []string{"review-1"}})).
		ok(record.Closure("finished"))
	return b.r.EncodeWire()
}
