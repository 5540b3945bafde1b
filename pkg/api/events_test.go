package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// Subscribe calls subscribed once the daemon answered the stream, before
// any event: an event the daemon publishes after that call reaches fn.
// The server here publishes only once the client said it is subscribed.
func TestSubscribe(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	subscribed := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(api.Error{Code: api.CodeNotFound, Message: "no"})
			return
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-subscribed:
		case <-time.After(10 * time.Second):
			return // the client never said so: the test fails below
		}
		_ = json.NewEncoder(w).Encode(api.Event{Kind: "drain.run", Run: "r1"})
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	c := api.NewClient(sock)
	var got []api.Event
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = c.Subscribe(ctx, func() { close(subscribed) }, func(e api.Event) bool {
		got = append(got, e)
		return true
	})
	if !errors.Is(err, io.EOF) || len(got) != 1 || got[0].Run != "r1" {
		t.Fatalf("Subscribe: %v, events %+v; want the one event, then io.EOF as the stream ends", err, got)
	}
}
