package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/internal/daemon"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// runWarm measures transcript resumes from a warm sandbox (docs/warm-pool.md)
// against plain create + start, side by side in one run on one embedded
// containerd, the daemon's pool holding up to pool sandboxes. Each round
// starts a plain container, then a poller run that it parks, waits until
// the pool has made the run's next sandbox, and posts the result: the
// post's time is posted result → unit running. A round whose resume did
// not take its warm sandbox is counted apart (it should not happen). It
// prints every round, then the medians and p99s, and the target ratio.
func runWarm(archive string, n, pool int) error {
	ctx := context.Background()
	d, pl, done, err := open(ctx, archive, "rrwb-", pool)
	if err != nil {
		return err
	}
	defer done()
	metrics := d.Rooms().Metrics
	var create, warm []time.Duration
	cold := 0
	fmt.Printf("round  plain create+start  warm resume (post→running)\n")
	for i := range n {
		c, _, err := pl.round(ctx, i)
		if err != nil {
			return err
		}
		rs, used, err := warmRound(ctx, d, metrics, fmt.Sprintf("wb-%d", i))
		if err != nil {
			return err
		}
		note := ""
		if !used {
			cold++
			note = "  (no warm sandbox: not counted)"
		} else {
			create, warm = append(create, c), append(warm, rs)
		}
		fmt.Printf("%5d  %17s  %26s%s\n", i+1, ms(c), ms(rs), note)
	}
	if len(warm) == 0 {
		return fmt.Errorf("no resume took a warm sandbox")
	}
	mc, mw := median(create), median(warm)
	fmt.Printf("median %17s  %26s\n", ms(mc), ms(mw))
	fmt.Printf("p99    %17s  %26s\n", ms(percentile(create, 0.99)), ms(percentile(warm, 0.99)))
	fmt.Printf("\nwarm resume: median %s (target ≤ 25 ms), p99 %s (target ≤ 50 ms); ÷ plain create+start %.2f; %d of %d resumes without a warm sandbox\n",
		ms(mw), ms(percentile(warm, 0.99)), float64(mw)/float64(mc), cold, n)
	return nil
}

// warmRound starts a poller run, parks it once it has dispatched, waits
// until the pool holds its next sandbox ready, and posts the result it
// awaits: it returns the post's time and whether the resume took the
// warm sandbox, once the run is over.
func warmRound(ctx context.Context, d *daemon.Daemon, metrics http.Handler, id string) (time.Duration, bool, error) {
	if _, err := d.Start(ctx, id, unit.Spec{Image: imageName, Mode: unit.TranscriptMode}, unit.Grants{}); err != nil {
		return 0, false, err
	}
	if err := waitCall(ctx, d, id); err != nil {
		return 0, false, err
	}
	if _, err := d.Park(ctx, id); err != nil {
		return 0, false, err
	}
	if err := waitWarm(metrics); err != nil {
		return 0, false, err
	}
	t := time.Now()
	pr, err := d.PostResult(ctx, id, "call-1", []byte(`"done"`))
	if err != nil {
		return 0, false, err
	}
	rs := time.Since(t)
	if pr.Resumed == nil {
		return 0, false, fmt.Errorf("run %s did not resume: %+v", id, pr)
	}
	used := pr.Resumed.Idle.Inputs["warm_pool_sandboxes"] == "1"
	return rs, used, waitClosed(ctx, d, id)
}

// waitWarm waits until the pool holds one sandbox ready and none being
// made, as /metrics says.
func waitWarm(metrics http.Handler) error {
	const ready, making = `runrecordd_warm_pool_sandboxes{state="ready"} 1`, `runrecordd_warm_pool_sandboxes{state="preparing"} 0`
	for range 1000 {
		rec := httptest.NewRecorder()
		metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		var r, m bool
		sc := bufio.NewScanner(rec.Body)
		for sc.Scan() {
			r = r || strings.HasPrefix(sc.Text(), ready)
			m = m || strings.HasPrefix(sc.Text(), making)
		}
		if r && m {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("the pool made no warm sandbox in 5 s")
}

// percentile is the p-th percentile of ds (nearest rank).
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
