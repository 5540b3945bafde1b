package criu

import (
	"fmt"
	"os"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
)

// DumpStats are CRIU's own figures of a dump, from the stats-dump it
// writes into its work directory (not the image directory).
type DumpStats struct {
	// Freezing is the time to freeze the tree, Frozen how long it stayed
	// frozen, MemDump and MemWrite the time to collect and to write the
	// memory pages.
	Freezing, Frozen, MemDump, MemWrite time.Duration
	// Pages scanned, written, and skipped as unchanged since a parent image.
	PagesScanned, PagesWritten, PagesSkippedParent uint64
}

// ReadDumpStats reads the stats-dump of a dump whose work directory is
// work.
func ReadDumpStats(work string) (DumpStats, error) {
	d, err := os.Open(work)
	if err != nil {
		return DumpStats{}, err
	}
	defer d.Close()
	ds, err := stats.CriuGetDumpStats(d)
	if err != nil {
		return DumpStats{}, fmt.Errorf("stats-dump: %w", err)
	}
	return DumpStats{
		Freezing: micros(ds.GetFreezingTime()), Frozen: micros(ds.GetFrozenTime()),
		MemDump: micros(ds.GetMemdumpTime()), MemWrite: micros(ds.GetMemwriteTime()),
		PagesScanned: ds.GetPagesScanned(), PagesWritten: ds.GetPagesWritten(), PagesSkippedParent: ds.GetPagesSkippedParent(),
	}, nil
}

// RestoreStats are CRIU's own figures of a restore, from its stats-restore.
type RestoreStats struct {
	// Forking is the time to fork the process tree, Restore the rest.
	Forking, Restore time.Duration
	// PagesRestored is how many memory pages CRIU restored.
	PagesRestored uint64
}

// ReadRestoreStats reads the stats-restore of a restore whose work
// directory is work; the zero RestoreStats when CRIU left none.
func ReadRestoreStats(work string) RestoreStats {
	d, err := os.Open(work)
	if err != nil {
		return RestoreStats{}
	}
	defer d.Close()
	rst, err := stats.CriuGetRestoreStats(d)
	if err != nil {
		return RestoreStats{}
	}
	return RestoreStats{Forking: micros(rst.GetForkingTime()), Restore: micros(rst.GetRestoreTime()), PagesRestored: rst.GetPagesRestored()}
}

func micros(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }
