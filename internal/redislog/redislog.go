// Package redislog keeps go-redis's log output about dlock's own clients out
// of the application's stderr.
//
// go-redis has one logger per process (redis.SetLogger), which writes to
// stderr by default: a dial that fails, for example, prints a line there
// even though the caller gets the error. A library must not write to stderr,
// and must not take the application's own logging away either. So this
// package's init puts a logger in place that drops the lines about the
// clients that the redis and redlock drivers made themselves (dlock.Open),
// which carry Hook — lines about a call under a context marked by Mark, or
// about one of their dial errors — and passes every other line to stderr as
// go-redis's default logger does. An application that calls redis.SetLogger replaces it, and then
// receives dlock's lines too.
package redislog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

func init() { goredis.SetLogger(&logger{}) }

type marker struct{}

// Mark returns ctx marked as a call of dlock's own.
//
// Hook marks every command, so the mark is made cheap: a markedCtx is one
// 16-byte allocation, where context.WithValue's is 48 bytes after a walk of
// the whole chain for the key; a ctx marked already deeper in its chain
// (a dial under a command's context) is marked again, which changes
// nothing.
func Mark(ctx context.Context) context.Context {
	if _, ok := ctx.(markedCtx); ok {
		return ctx
	}
	return markedCtx{ctx}
}

// markedCtx is a context marked by Mark: its Value of marker{} is true,
// and it is its parent in everything else.
type markedCtx struct{ context.Context }

func (c markedCtx) Value(key any) any {
	if _, ok := key.(marker); ok {
		return true
	}
	return c.Context.Value(key)
}

// marked reports whether ctx was marked by Mark.
func marked(ctx context.Context) bool { return ctx != nil && ctx.Value(marker{}) != nil }

// Hook marks every call of a client: add it with AddHook to the clients the
// drivers make themselves.
type Hook struct{}

// DialHook marks the errors of the client's dials: go-redis dials in the
// background, under a context of its own, and logs the error it got.
func (Hook) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(Mark(ctx), network, addr)
		if err != nil {
			err = &dialError{err}
		}
		return c, err
	}
}

// dialError is a dial error of a client of dlock's own; its text is the
// error's.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func (Hook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error { return next(Mark(ctx), cmd) }
}

func (Hook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error { return next(Mark(ctx), cmds) }
}

var (
	outMu sync.Mutex
	out   io.Writer = os.Stderr
	std             = log.New(writer{}, "redis: ", log.LstdFlags|log.Lshortfile)
)

// writer writes to out, which tests may change.
type writer struct{}

func (writer) Write(p []byte) (int, error) {
	outMu.Lock()
	defer outMu.Unlock()
	return out.Write(p)
}

type logger struct{}

// Printf is called by go-redis's process-wide logger, itself called where
// the line comes from: calldepth 3 names that place, as go-redis's default
// logger does.
func (*logger) Printf(ctx context.Context, format string, v ...any) {
	if marked(ctx) {
		return
	}
	for _, a := range v {
		var de *dialError
		if err, ok := a.(error); ok && errors.As(err, &de) {
			return
		}
	}
	_ = std.Output(3, fmt.Sprintf(format, v...))
}
