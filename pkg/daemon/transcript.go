package daemon

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ProtocolVersion is the transcript channel's protocol, which a transcript
// park's environment manifest records.
const ProtocolVersion = "runrecordd.unit/1"

// ChannelMount is where a transcript unit finds its channel directory.
const ChannelMount = "/run/runrecordd"

// channel is a transcript unit's directory: its transcript and its socket.
type channel struct {
	dir string
}

// callResult is a result posted for a call.
type callResult struct {
	ID      string
	Payload []byte
}

func (d *Daemon) openChannel(id string, restored *resumed) (*channel, error) {
	return nil, fmt.Errorf("%w: transcript mode is not served yet", ErrInvalid)
}

func (c *channel) transcriptPath() string { return filepath.Join(c.dir, "transcript") }

func (c *channel) close() { os.RemoveAll(c.dir) }

func (c *channel) serve(d *Daemon, id string, lv *live) {}

// account is the interval's call account. An image-mode unit has no
// channel to dispatch through and no network beyond loopback, so its
// interval accounts for no calls.
func (lv *live) account() *record.CallAccount {
	if lv.spec.Mode != unit.TranscriptMode {
		return &record.CallAccount{}
	}
	return &record.CallAccount{}
}
