package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// ErrResultsHeld refuses the export of a run with results posted on this
// host for calls it still awaits.
var ErrResultsHeld = errors.New("results held on this host")

// Exporter is a host's exports of its runs: each judged and handed off
// under the run's lock, so that no resume or close comes between, and
// streamed without it; its books kept in Books.
type Exporter struct {
	Store interface {
		Store
		Reclaimer
	}
	Books *Exports
	// Lock holds stored run id (the daemon's run lock) until the function
	// it returns.
	Lock func(id string) (unlock func(), err error)
	// Held are the calls of run id with a result posted on this host that
	// the run still awaits beside others (calls.Held).
	Held func(id string) ([]string, error)
	Log  *slog.Logger
	// HandedOff tells that run id was handed off, once its bundle was
	// delivered whole.
	HandedOff func(id string)
}

// Exportable says whether run id can be exported now: only a parked run
// can ([Exportable]), and only if no result posted here awaits the run's
// other calls — a bundle does not carry them, and the host importing it
// would show those calls as unanswered (ErrResultsHeld).
func (x Exporter) Exportable(id string) error {
	if err := Exportable(x.Store, id); err != nil {
		return err
	}
	if held, err := x.Held(id); err == nil && len(held) > 0 {
		return fmt.Errorf("export %s: %w: results are posted here for %s, which the run still awaits with others; post the rest (the run resumes here), or close it", id, ErrResultsHeld, strings.Join(held, ", "))
	}
	return nil
}

// Export writes run id's bundle to w ([Export]). With handoff (the
// default of the API and the CLI) the run is handed off before the first
// byte is written ([Prepare]): from then on the host refuses to resume,
// close or post results to it, until a bundle extending its record is
// imported back. Without handoff the bundle is marked a copy. A failed
// export takes its handoff back unless a bundle may be out there
// ([Exports]).
func (x Exporter) Export(ctx context.Context, id string, w io.Writer, handoff bool) (err error) {
	unlock, err := x.Lock(id)
	if err != nil {
		return err
	}
	err = x.Exportable(id)
	var o ExportOptions
	var made bool
	if err == nil {
		o, made, err = x.Books.Begin(x.Store, id, handoff)
	}
	unlock()
	if err != nil {
		return err
	}
	defer func() {
		unlock, lerr := x.Lock(id)
		if lerr != nil {
			x.Log.Error("export ended and its books could not be closed", "run", id, "err", lerr)
			return
		}
		defer unlock()
		switch ended, rerr := x.Books.End(x.Store, id, o, made, err); {
		case rerr != nil:
			x.Log.Error("export failed and its handoff could not be taken back", "run", id, "err", rerr)
		case ended == HandedOff:
			x.Log.Info("run handed off", "run", id, "head", o.Record.Head())
			x.HandedOff(id)
		case ended == TakenBack:
			x.Log.Warn("export failed before its bundle was whole: the handoff is taken back", "run", id, "err", err)
		}
	}()
	return Export(ctx, x.Store, id, w, o)
}
