package transfer_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"testing"

	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
)

// BenchmarkFetch moves a 64 MiB image run (16 files of 4 MiB) over
// loopback into an empty store, each iteration into a new one.
func BenchmarkFetch(b *testing.B) {
	a := mustStore(b)
	files := map[string][]byte{}
	for i := range 16 {
		p := make([]byte, 4<<20)
		rand.Read(p)
		files[fmt.Sprintf("pages-%d.img", i)] = p
	}
	rec := imageRun(b, a, "r1", files, map[string][]byte{"core-1.img": []byte("core")})
	srv := serve(b, a, nil)
	b.SetBytes(64 << 20)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		dst := mustStore(b)
		b.StartTimer()
		s, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, dst, rec, transfer.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if s.Bytes < 64<<20 {
			b.Fatalf("%d bytes fetched", s.Bytes)
		}
	}
}
