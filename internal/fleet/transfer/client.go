package transfer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Missing asks the peer at base which of want it does not hold (POST
// /v1/objects/missing, in batches of [MaxMissing]): how much a migration
// there would move. The answer is the peer's word, each address of want
// at most once; [Fetch] does not rely on it (the fetching host checks its
// own store).
func Missing(ctx context.Context, c *http.Client, base string, want []record.Address) ([]record.Address, error) {
	out := []record.Address{}
	seen := make(map[record.Address]bool, len(want))
	var uniq []record.Address
	for _, a := range want {
		if !seen[a] {
			seen[a] = true
			uniq = append(uniq, a)
		}
	}
	want = uniq
	for len(want) > 0 {
		batch := want[:min(len(want), MaxMissing)]
		want = want[len(batch):]
		got, err := missing(ctx, c, base, batch)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func missing(ctx context.Context, c *http.Client, base string, batch []record.Address) ([]record.Address, error) {
	body, err := json.Marshal(MissingRequest{Objects: batch})
	if err != nil {
		return nil, err
	}
	url := strings.TrimSuffix(base, "/") + "/v1/objects/missing"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("transfer: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("transfer: missing: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("transfer: missing: %w: %s: %s", ErrPeer, resp.Status, peerMessage(resp.Body))
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, MaxMissingBody))
	dec.DisallowUnknownFields()
	var r MissingResponse
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("transfer: missing: %w: %w", ErrPeer, err)
	}
	asked := make(map[record.Address]bool, len(batch))
	for _, a := range batch {
		asked[a] = true
	}
	for _, a := range r.Missing {
		if !asked[a] {
			return nil, fmt.Errorf("transfer: missing: %w: %s was not asked about, or is named twice", ErrPeer, a)
		}
		asked[a] = false
	}
	return r.Missing, nil
}
