package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestZapToSlog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	z := zapToSlog(log, zapcore.WarnLevel).Named("etcd-client").With(zap.String("endpoint", "10.0.0.1:2379"))
	z.Info("dialing")
	z.Debug("noise")
	z.Warn("retrying of unary invoker failed", zap.Error(errors.New("context deadline exceeded")), zap.Int("attempt", 3))
	z.Error("lost the lease")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want the warning and the error only, got %d lines:\n%s", len(lines), buf.String())
	}
	var w, e map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &w); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &e); err != nil {
		t.Fatal(err)
	}
	if w["level"] != "WARN" || w["msg"] != "retrying of unary invoker failed" || w["error"] != "context deadline exceeded" ||
		w["attempt"] != float64(3) || w["endpoint"] != "10.0.0.1:2379" || w["logger"] != "etcd-client" {
		t.Errorf("warning: %v", w)
	}
	if e["level"] != "ERROR" || e["msg"] != "lost the lease" || e["endpoint"] != "10.0.0.1:2379" {
		t.Errorf("error: %v", e)
	}
}
