// What a library logs with zap (the etcd client) goes into the daemon's
// slog logger, from a least level up: the daemon has one log, in one
// format.

package main

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapToSlog returns a zap logger whose entries at min and above go to log, at
// the slog level of the same name (zap's DPanic, Panic and Fatal as
// error), with the logger's name as "logger" and zap's fields as attrs.
func zapToSlog(log *slog.Logger, min zapcore.Level) *zap.Logger {
	return zap.New(&slogCore{log: log, min: min})
}

// slogCore is a zapcore.Core that writes to a slog logger.
type slogCore struct {
	log *slog.Logger
	min zapcore.Level
	// with are the fields With added, encoded.
	with []slog.Attr
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, min: c.min, with: append(append([]slog.Attr(nil), c.with...), slogAttrs(fs)...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	as := append(append([]slog.Attr(nil), c.with...), slogAttrs(fs)...)
	if e.LoggerName != "" {
		as = append(as, slog.String("logger", e.LoggerName))
	}
	c.log.LogAttrs(context.Background(), slogLevel(e.Level), e.Message, as...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

// slogLevel is l's slog level.
func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

// slogAttrs are zap's fields as slog attrs, encoded by zap's own map encoder
// (an error field as its text).
func slogAttrs(fs []zapcore.Field) []slog.Attr {
	if len(fs) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fs {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		out = append(out, slog.Any(k, v))
	}
	return out
}
