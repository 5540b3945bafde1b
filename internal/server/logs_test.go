package server

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
)

func TestLogOptions(t *testing.T) {
	for _, q := range []string{"follow=maybe", "tail=-1", "tail=x", "since=yesterday", "since=-5m"} {
		if _, err := logOptions(httptest.NewRequest("GET", "/v1/runs/r/logs?"+q, nil)); !errors.Is(err, answers.ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", q, err)
		}
	}
	o, err := logOptions(httptest.NewRequest("GET", "/v1/runs/r/logs", nil))
	if err != nil || o.Follow || o.Tail != -1 || !o.Since.IsZero() {
		t.Fatalf("no query: %+v, %v; want all, no follow", o, err)
	}
	o, err = logOptions(httptest.NewRequest("GET", "/v1/runs/r/logs?follow=true&tail=0&since=2026-12-06T08:00:00Z", nil))
	if err != nil || !o.Follow || o.Tail != 0 || !o.Since.Equal(time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)) {
		t.Fatalf("%+v, %v", o, err)
	}
	before := time.Now().Add(-10 * time.Minute)
	o, err = logOptions(httptest.NewRequest("GET", "/v1/runs/r/logs?since=10m", nil))
	if err != nil || o.Since.Before(before) || o.Since.After(time.Now().Add(-10*time.Minute)) {
		t.Fatalf("since=10m: %v, %v", o.Since, err)
	}
}
