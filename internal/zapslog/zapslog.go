// Package zapslog carries what a library logs with zap (the etcd client)
// into the daemon's slog logger, from a least level up: the daemon has one
// log, in one format.
package zapslog

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger whose entries at min and above go to log, at
// the slog level of the same name (zap's DPanic, Panic and Fatal as
// error), with the logger's name as "logger" and zap's fields as attrs.
func New(log *slog.Logger, min zapcore.Level) *zap.Logger {
	return zap.New(&core{log: log, min: min})
}

// core is a zapcore.Core that writes to a slog logger.
type core struct {
	log *slog.Logger
	min zapcore.Level
	// with are the fields With added, encoded.
	with []slog.Attr
}

func (c *core) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *core) With(fs []zapcore.Field) zapcore.Core {
	return &core{log: c.log, min: c.min, with: append(append([]slog.Attr(nil), c.with...), attrs(fs)...)}
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fs []zapcore.Field) error {
	as := append(append([]slog.Attr(nil), c.with...), attrs(fs)...)
	if e.LoggerName != "" {
		as = append(as, slog.String("logger", e.LoggerName))
	}
	c.log.LogAttrs(context.Background(), level(e.Level), e.Message, as...)
	return nil
}

func (c *core) Sync() error { return nil }

// level is l's slog level.
func level(l zapcore.Level) slog.Level {
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

// attrs are zap's fields as slog attrs, encoded by zap's own map encoder
// (an error field as its text).
func attrs(fs []zapcore.Field) []slog.Attr {
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
