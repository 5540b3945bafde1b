package park

import (
	"strings"
	"testing"
)

// The fields images/pagemap.proto declares uint32 (pagemap_head.pages_id,
// pagemap_entry.compat_nr_pages and flags) are refused past 2^32-1: CRIU
// (protobuf-c) reads the low 32 bits, so pages_id 2^32+1 would name
// pages-4294967297.img here and pages-1.img to CRIU.
func TestParsePagemapRefusesPastUint32(t *testing.T) {
	const over = 1<<32 + 1
	for name, b := range map[string][]byte{
		"pages_id":        pagemapMessages([]uint64{1, over}, []uint64{1, 0x1000, 4, pePresent, 5, 1}),
		"compat_nr_pages": pagemapMessages([]uint64{1, 1}, []uint64{1, 0x1000, 2, over, 4, pePresent}),
		"flags":           pagemapMessages([]uint64{1, 1}, []uint64{1, 0x1000, 4, 1<<32 | pePresent, 5, 1}),
	} {
		if pm, err := parsePagemap(b); err == nil || !strings.Contains(err.Error(), name+" ") || !strings.Contains(err.Error(), "uint32") {
			t.Errorf("%s past uint32: %+v, %v", name, pm, err)
		}
	}
	// At 2^32-1 each is what CRIU reads.
	pm, err := parsePagemap(pagemapMessages([]uint64{1, 1<<32 - 1}, []uint64{1, 0x1000, 2, 1, 4, 1<<32 - 1}))
	if err != nil || pm.pages != "pages-4294967295.img" || len(pm.runs) != 1 {
		t.Fatalf("fields at 2^32-1: %+v, %v", pm, err)
	}
}

// A pagemap is a task's only under the name CRIU gives it, the process id
// in canonical decimal: pagemap-007.img is not task 7's (CRIU reads
// pagemap-7.img), so two pagemaps cannot both claim one task.
func TestPagemapTask(t *testing.T) {
	for name, want := range map[string]uint64{
		"pagemap-7.img":                    7,
		"pagemap-1234.img":                 1234,
		"pagemap-18446744073709551615.img": 1<<64 - 1,
		"pagemap-007.img":                  0,
		"pagemap-0.img":                    0,
		"pagemap-+7.img":                   0,
		"pagemap--7.img":                   0,
		"pagemap- 7.img":                   0,
		"pagemap-7.img.img":                0,
		"pagemap-7":                        0,
		"pagemap-shmem-7.img":              0,
	} {
		id, ok := pagemap{name: name}.task()
		if ok != (want != 0) || id != want && ok {
			t.Errorf("%s: task %d, %v; want %d", name, id, ok, want)
		}
	}
}
