package attest

import "testing"

// Each detail's bytes, written out by hand: the journal holds these, so a
// change here changes evidence and must be deliberate.
func TestLifecyclePinned(t *testing.T) {
	for _, c := range []struct {
		d    Detail
		want string
	}{
		{Checkpointed{TotalNS: 1, PauseNS: 2, DumpNS: 3, DiffNS: 4, FreezingNS: 5, FrozenNS: 6, MemDumpNS: 7, MemWriteNS: 8, Pages: 9, PagesScan: 10, ImageBytes: 11, RootBytes: 12, IngestNS: 13},
			`checkpointed {"total_ns":1,"pause_ns":2,"dump_ns":3,"diff_ns":4,"freezing_ns":5,"frozen_ns":6,"mem_dump_ns":7,"mem_write_ns":8,"pages_written":9,"pages_scanned":10,"image_bytes":11,"rootfs_bytes":12,"ingest_ns":13}`},
		{Restored{TotalNS: 1, MaterializeNS: 2, RootfsNS: 3, TaskNS: 4, ForkingNS: 5, RestoreNS: 6, Pages: 7},
			`restored {"total_ns":1,"materialize_ns":2,"rootfs_ns":3,"task_ns":4,"forking_ns":5,"restore_ns":6,"pages_restored":7}`},
		{Restored{TotalNS: 1, Pages: 7, Lazy: true},
			`restored {"total_ns":1,"materialize_ns":0,"rootfs_ns":0,"task_ns":0,"forking_ns":0,"restore_ns":0,"pages_restored":7,"lazy":true}`},
		{Resident{NS: 5}, `resident {"ns":5}`},
		{PagesLost{AfterNS: 5, Reason: "<gone>"}, `pages-lost {"after_ns":5,"reason":"\u003cgone\u003e"}`},
		{Idle{Inputs: map[string]string{"method": "estimate", "b": "<2>"}, ParkedNS: 5, Provenance: "estimated", RetainedBytes: 6, UJ: 7},
			`idle {"inputs":{"b":"\u003c2\u003e","method":"estimate"},"parked_ns":5,"provenance":"estimated","retained_bytes":6,"uj":7}`},
		{Recovered{Reason: "gone"}, `recovered {"reason":"gone"}`},
		{UnitLost{Reason: "<gone>"}, `unit-lost {"reason":"\u003cgone\u003e"}`},
		{OutputOmitted{Stream: Stdout, FromOffset: 5, Bytes: 6}, `output-omitted {"stream":1,"from_offset":5,"bytes":6}`},
		{OutputDiscarded{StdoutBytes: 1, StderrBytes: 2, LimitBytes: 3}, `output-discarded {"stdout_bytes":1,"stderr_bytes":2,"limit_bytes":3}`},
	} {
		e := LifecycleOf(42, c.d)
		if e.Kind != Lifecycle || e.AtNS != 42 || string(e.Data) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.d.Event(), e.Data, c.want)
		}
	}
	if e := Event(1, EventParkRefused); string(e.Data) != "park-refused" || e.Kind != Lifecycle {
		t.Fatalf("event %q", e.Data)
	}
}

func TestJournalFind(t *testing.T) {
	var j Journal
	j.Entries = append(j.Entries, Event(1, EventStarted), Entry{Kind: Stdout, AtNS: 2, Data: []byte(`checkpointed {"total_ns":9}`)},
		Entry{Kind: Lifecycle, AtNS: 3, Data: []byte(`checkpointed {broken`)}, LifecycleOf(4, Checkpointed{TotalNS: 5}))
	var cp Checkpointed
	if !j.Find(&cp) || cp.TotalNS != 5 {
		t.Fatalf("found %+v", cp)
	}
	if j.Find(&Restored{}) {
		t.Fatal("found a detail the journal does not hold")
	}
}
