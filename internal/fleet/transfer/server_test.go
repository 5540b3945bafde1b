package transfer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// get returns a GET's status, body and Content-Length.
func get(t *testing.T, url string) (int, []byte, int64) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.ContentLength
}

// errorCode decodes an api.Error body.
func errorCode(t *testing.T, b []byte) string {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal(b, &e); err != nil || e.Message == "" {
		t.Fatalf("error body %q: %v", b, err)
	}
	return e.Code
}

func TestHandlerObject(t *testing.T) {
	a := mustStore(t)
	obj := mustPut(t, a, []byte("an object"))
	srv := serve(t, a, nil)
	base := srv.URL + "/v1/objects/"

	status, b, n := get(t, base+obj.String())
	if status != http.StatusOK || string(b) != "an object" || n != int64(len(b)) {
		t.Fatalf("GET: %d %q (Content-Length %d)", status, b, n)
	}
	for _, bad := range []string{"nope", "b3:short", strings.TrimPrefix(obj.String(), "b3:"), obj.String()[:45] + "_", obj.String() + "A"} {
		status, b, _ := get(t, base+bad)
		if status != http.StatusBadRequest || errorCode(t, b) != api.CodeBadRequest {
			t.Fatalf("GET %s: %d %s, want 400 bad_request", bad, status, b)
		}
	}
	absent := record.Sum([]byte("absent"))
	if status, b, _ := get(t, base+absent.String()); status != http.StatusNotFound || errorCode(t, b) != api.CodeNotFound {
		t.Fatalf("GET absent: %d %s, want 404 not_found", status, b)
	}
}

// An object damaged in the serving store is never received whole: the
// fetching host refuses it, and adopts nothing.
func TestHandlerCorrupt(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := transcriptRun(t, a, "r1")
	ta := *rec.Segment(1).Snapshot.Transcript
	p := a.Path(ta)
	old, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	damaged := bytes.Clone(old)
	damaged[0] ^= 1
	if err := os.WriteFile(p, damaged, 0o400); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(p, old, 0o400) }) // for A's own Check
	srv := serve(t, a, nil)
	_, err = transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{})
	// Cut off before its headers were sent (a small object is buffered
	// whole) or after: either way an error, and nothing adopted.
	if err == nil {
		t.Fatal("fetch of a damaged object: no error")
	}
	if b.Has(ta) {
		t.Fatal("adopted")
	}
}

func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestHandlerMissing(t *testing.T) {
	a := mustStore(t)
	have := mustPut(t, a, []byte("have"))
	lack1, lack2 := record.Sum([]byte("1")), record.Sum([]byte("2"))
	srv := serve(t, a, nil)
	url := srv.URL + "/v1/objects/missing"

	got, err := transfer.Missing(context.Background(), http.DefaultClient, srv.URL, []record.Address{lack1, have, lack2, lack1})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != lack1 || got[1] != lack2 {
		t.Fatalf("missing %v, want [%s %s]", got, lack1, lack2)
	}
	// Asked twice, answered once.
	status, b := post(t, url, `{"objects":["`+lack1.String()+`","`+lack1.String()+`","`+have.String()+`"]}`)
	if want := `{"missing":["` + lack1.String() + `"]}`; status != http.StatusOK || strings.TrimSpace(string(b)) != want {
		t.Fatalf("POST: %d %s, want %s", status, b, want)
	}
	for name, body := range map[string]string{
		"unknown field": `{"objects":[],"more":1}`,
		"trailing":      `{"objects":[]} {}`,
		"bad address":   `{"objects":["b3:x"]}`,
		"not json":      `objects`,
	} {
		if status, b := post(t, url, body); status != http.StatusBadRequest || errorCode(t, b) != api.CodeBadRequest {
			t.Fatalf("%s: %d %s, want 400", name, status, b)
		}
	}
	many := make([]record.Address, transfer.MaxMissing+1)
	body, _ := json.Marshal(transfer.MissingRequest{Objects: many})
	if status, b := post(t, url, string(body)); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("%d addresses: %d %s, want 413", len(many), status, b)
	}
	huge := `{"objects":["` + strings.Repeat("A", 8<<20) + `"]}`
	if status, b := post(t, url, huge); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("an 8 MiB body: %d %s, want 413", status, b)
	}
	// More than a batch: the client asks in batches.
	for i := range many {
		many[i] = record.Sum([]byte{byte(i), byte(i >> 8), byte(i >> 16)})
	}
	got, err = transfer.Missing(context.Background(), http.DefaultClient, srv.URL, append(many, have, lack2, many[0]))
	if err != nil || len(got) != len(many)+1 || got[len(many)] != lack2 {
		t.Fatalf("two batches: %d missing, %v", len(got), err)
	}
}

// A peer answering about addresses it was not asked about is refused.
func TestMissingHostile(t *testing.T) {
	a := mustStore(t)
	other := record.Sum([]byte("other"))
	srv := serve(t, a, func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(transfer.MissingResponse{Missing: []record.Address{other}})
		})
	})
	_, err := transfer.Missing(context.Background(), http.DefaultClient, srv.URL, []record.Address{record.Sum([]byte("asked"))})
	if !errors.Is(err, transfer.ErrPeer) {
		t.Fatalf("missing: %v, want ErrPeer", err)
	}
}
