package calls

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// ChannelDir is where a run's channel directory lies beneath the daemon's
// state directory (Config.Dir): STATE/ch/RUN.
func ChannelDir(stateDir, run string) string { return filepath.Join(stateDir, "ch", run) }

// Recover stores the transcript a transcript unit left in its channel
// directory when the daemon serving the channel stopped, for a park of its
// interval without an account. It is read as ReadTranscript reads it:
// beneath stateDir, within limit bytes, a regular file the daemon made or
// nothing. A file it refuses is removed with its directory, so that the
// next start does not meet it again ([ErrTranscript]). The caller removes
// the directory once the park is recorded (ChannelDir).
func Recover(ctx context.Context, st Objects, stateDir, run string, limit uint64) (record.Address, error) {
	rel := filepath.Join("ch", run, protocol.TranscriptFile)
	f, err := ReadTranscript(stateDir, rel, limit)
	if err != nil {
		if errors.Is(err, ErrTranscript) {
			os.RemoveAll(ChannelDir(stateDir, run))
		}
		return record.Address{}, fmt.Errorf("run %s: recovering the transcript: %w", run, err)
	}
	defer f.Close()
	return st.Put(ctx, io.LimitReader(f, int64(min(limit, math.MaxInt64))))
}
