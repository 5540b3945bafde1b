package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// The etcd client's warnings and errors reach serve's log; its info does
// not, and without a log (the fleet verbs) it says nothing.
func TestEtcdClientLog(t *testing.T) {
	var buf bytes.Buffer
	e := etcdFlags{endpoints: "127.0.0.1:1", timeout: 1, log: newLogger(&buf, "json", slog.LevelInfo)}
	cfg, err := e.config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger.Info("dialing")
	cfg.Logger.Warn("retrying of unary invoker failed")
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("want one JSON line, got %q: %v", buf.String(), err)
	}
	if got["level"] != "WARN" || got["msg"] != "retrying of unary invoker failed" || got["from"] != "etcd-client" {
		t.Fatalf("logged %v", got)
	}
	e.log = nil
	if cfg, err = e.config(); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	cfg.Logger.Error("unheard")
	if buf.Len() != 0 {
		t.Fatalf("without a log: %q", buf.String())
	}
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	newLogger(&buf, "text", slog.LevelWarn).Info("hidden")
	newLogger(&buf, "text", slog.LevelWarn).Warn("shown", "k", "v")
	if s := buf.String(); strings.Contains(s, "hidden") || !strings.Contains(s, "level=WARN msg=shown k=v") {
		t.Fatalf("text: %q", s)
	}
	buf.Reset()
	newLogger(&buf, "json", slog.LevelInfo).Info("serving", "socket", "/s")
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil || got["msg"] != "serving" || got["socket"] != "/s" {
		t.Fatalf("json: %q, %v", buf.String(), err)
	}
}
