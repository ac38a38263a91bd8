// Package zookeeperexport holds package zookeeper's test hooks for the tests
// module; package zookeeper sets them at init (see ../doc.go).
package zookeeperexport

import (
	"context"
	"time"

	"github.com/dlock/dlock"
)

// Options is *zookeeper.Options (an any here: this package cannot import the
// driver, which imports it).
type Options = any

var (
	// SetIdleAfter replaces how long an unused session stays open, for a
	// test; it returns a function restoring it.
	SetIdleAfter func(d time.Duration) (restore func())
	// ConnectWithOrphans is Connect, also returning a function that
	// creates, in the Locker's session for ttl, a lock node under name that
	// no acquisition tracks (as a create whose outcome was lost leaves one),
	// and returns its path.
	ConnectWithOrphans func(ctx context.Context, servers []string, opts Options) (*dlock.Locker, func(ctx context.Context, name string, ttl time.Duration) (string, error), error)
	// ConnectWithWatch is Connect, also returning the driver's Watch and a
	// function giving the server watch that Watch shares for a name (nil
	// when there is none), to compare.
	ConnectWithWatch func(ctx context.Context, servers []string, opts Options) (*dlock.Locker, func(ctx context.Context, name string) (<-chan struct{}, func(), error), func(name string) any, error)
)
