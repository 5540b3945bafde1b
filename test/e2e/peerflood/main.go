// Command peerflood is the e2e tests' handshake flood against a host's
// peer listener (test/e2e/fleet_attack_test.go), run as a process of its
// own so that the test process that measures the hosts' lease renewals is
// not the one flooding: TLS handshakes with fresh ed25519 keys nobody
// admitted, paced at -rate a second for -for, from -workers goroutines
// each dialing from a loopback address of its own (127.1.0.0/16). It
// prints one JSON line: how many handshakes were due, begun, cut before
// their end (a limit or the deadline), refused by the admission check,
// and other.
package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Counts are the flood's handshakes by how they ended, on the client's
// side.
type Counts struct {
	Due     int64 `json:"due"`
	Begun   int64 `json:"begun"`
	Cut     int64 `json:"cut"`
	Refused int64 `json:"refused"`
	Other   int64 `json:"other"`
}

func main() {
	addr := flag.String("addr", "", "the peer listener, host:port")
	key := flag.String("key", "", "the server's key id")
	rate := flag.Int("rate", 1000, "handshakes a second")
	d := flag.Duration("for", 6*time.Second, "how long")
	workers := flag.Int("workers", 1024, "handshakes under way at most")
	flag.Parse()
	server, err := record.ParseAddress(*key)
	if err != nil || *addr == "" || *rate <= 0 || *workers <= 0 || *workers > 1<<16 {
		fmt.Fprintln(os.Stderr, "peerflood: -addr, -key, -rate and -workers (1..65536) are needed:", err)
		os.Exit(2)
	}
	c := flood(*addr, server, *rate, *workers, *d)
	_ = json.NewEncoder(os.Stdout).Encode(c)
}

func flood(addr string, server record.Address, rate, workers int, d time.Duration) Counts {
	var due, begun, cut, refused, other atomic.Int64
	jobs := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := &net.TCPAddr{IP: net.IPv4(127, 1, byte(i>>8), byte(i&0xff)+1)}
			for range jobs {
				_, key, _ := ed25519.GenerateKey(rand.Reader)
				dl := &net.Dialer{Timeout: 2 * time.Second, LocalAddr: src}
				c, err := tls.DialWithDialer(dl, "tcp", addr, peer.ClientConfig(key, server))
				if err == nil {
					// TLS 1.3: the client's certificate is judged after the
					// client's handshake ends; a read sees the verdict.
					_ = c.SetReadDeadline(time.Now().Add(6 * time.Second))
					_, err = c.Read(make([]byte, 1))
					c.Close()
				}
				var ne net.Error
				switch {
				case err != nil && strings.Contains(err.Error(), "bad certificate"):
					refused.Add(1)
				case errors.As(err, &ne) && ne.Timeout():
					other.Add(1)
				case err != nil:
					cut.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	// Paced by the clock, not by ticks a busy process may miss: every
	// 10 ms, the handshakes due since the start.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for now := range tick.C {
		if now.Sub(start) >= d {
			break
		}
		for want := int64(now.Sub(start).Seconds() * float64(rate)); due.Load() < want; {
			due.Add(1)
			select {
			case jobs <- struct{}{}:
				begun.Add(1)
			default: // every worker busy: this handshake is not made
			}
		}
	}
	close(jobs)
	wg.Wait()
	return Counts{Due: due.Load(), Begun: begun.Load(), Cut: cut.Load(), Refused: refused.Load(), Other: other.Load()}
}
