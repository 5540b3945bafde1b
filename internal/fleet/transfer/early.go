package transfer

import (
	"os"
	"sync"
	"sync/atomic"
)

// Early fsyncs: a staged object is fsynced in the background as soon as
// it is staged, while the fetch and the checks go on, so that the fsyncs
// of its adoption ([store.Store.AdoptFiles], which fsyncs every file
// itself and answers for durability) find its bytes on disk already, or
// on their way. An early fsync that fails, is skipped or is still under
// way at the adoption only leaves that work to the adoption's own.
const (
	earlyWorkers = 4  // fsyncs in flight at once
	earlyQueue   = 64 // files waiting; past that a file is left to the adoption
)

// early is the background fsyncs of one fetch's staged files. add and
// stop are called from one goroutine (the fetch's, then its adoption's or
// its Close's).
type early struct {
	queue   chan string
	stopped atomic.Bool
}

// add fsyncs the staged file at p in the background, unless the queue is
// full or the fsyncs were stopped.
func (e *early) add(p string) {
	if e.stopped.Load() {
		return
	}
	if e.queue == nil {
		e.queue = make(chan string, earlyQueue)
		var wg sync.WaitGroup
		for range earlyWorkers {
			wg.Go(func() {
				for p := range e.queue {
					if e.stopped.Load() {
						continue // left to the adoption
					}
					if f, err := os.Open(p); err == nil {
						f.Sync()
						f.Close()
					}
				}
			})
		}
	}
	select {
	case e.queue <- p:
	default:
	}
}

// stop takes no more files and starts none queued; it does not wait for
// the fsyncs under way, whose workers end with them.
func (e *early) stop() {
	if e.stopped.Swap(true) || e.queue == nil {
		return
	}
	close(e.queue)
}
