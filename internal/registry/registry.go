// Package registry holds the URL schemes drivers register, one registry for
// every kind of service: lock drivers (driver.Register, looked up by
// dlock.Open) and task-queue drivers (queue/driver.Register, looked up by
// queue.Open). A scheme may be registered once per kind: redis:// names a
// lock driver and a queue driver, each linked by its own package.
package registry

import (
	"slices"
	"sync"
)

// The kinds of service.
const (
	Lock  = "lock"
	Queue = "queue"
)

type key struct{ kind, scheme string }

var (
	mu    sync.RWMutex
	funcs = map[key]any{}
)

// Register stores open under the kind and scheme; it panics on a nil open
// or a scheme registered twice for a kind, as database/sql.Register does.
func Register(kind, scheme string, open any, isNil bool) {
	mu.Lock()
	defer mu.Unlock()
	if isNil {
		panic("dlock: Register of a nil OpenFunc for " + kind + " scheme " + scheme)
	}
	k := key{kind, scheme}
	if _, dup := funcs[k]; dup {
		panic("dlock: Register called twice for " + kind + " scheme " + scheme)
	}
	funcs[k] = open
}

// Lookup returns what was registered under the kind and scheme, or nil.
func Lookup(kind, scheme string) any {
	mu.RLock()
	defer mu.RUnlock()
	return funcs[key{kind, scheme}]
}

// Schemes lists the schemes registered for the kind, sorted.
func Schemes(kind string) []string {
	mu.RLock()
	defer mu.RUnlock()
	var s []string
	for k := range funcs {
		if k.kind == kind {
			s = append(s, k.scheme)
		}
	}
	slices.Sort(s)
	return s
}
