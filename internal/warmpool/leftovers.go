package warmpool

import (
	"log/slog"
	"os"
	"path/filepath"
)

// RemoveLeftovers removes, at a daemon's start and before its reconcile,
// the channel directories under dir (STATE/ch) of runs not executing in
// their record: what a daemon killed with warm sandboxes left (their
// containers are removed by the reconcile, which keeps no sandbox of a
// parked run), and what a park or a resume cut short left. A directory
// whose run executes, or whose record cannot be read, is kept: a unit the
// last daemon left running is recovered from it. executing reports
// whether run executes in its record (false with no such run).
func RemoveLeftovers(dir string, executing func(run string) (bool, error), log *slog.Logger) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !os.IsNotExist(err) {
			log.Warn("warm pool: reading the channel directories", "dir", dir, "err", err)
		}
		return
	}
	for _, e := range ents {
		run := e.Name()
		ex, err := executing(run)
		if err != nil {
			log.Warn("warm pool: the run of a channel directory cannot be read; leaving it", "run", run, "err", err)
			continue
		}
		if ex {
			continue
		}
		log.Info("removing the channel directory of a run not executing", "run", run)
		if err := os.RemoveAll(filepath.Join(dir, run)); err != nil {
			log.Warn("warm pool: channel directory not removed", "run", run, "err", err)
		}
	}
}
