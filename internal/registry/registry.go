// Package registry holds the URL schemes drivers register (driver.Register)
// and dlock.Open looks up.
package registry

import (
	"slices"
	"sync"
)

var (
	mu    sync.RWMutex
	funcs = map[string]any{}
)

// Register stores open under scheme; it panics on a nil open or a scheme
// registered twice, as database/sql.Register does.
func Register(scheme string, open any, isNil bool) {
	mu.Lock()
	defer mu.Unlock()
	if isNil {
		panic("dlock: Register of a nil OpenFunc for " + scheme)
	}
	if _, dup := funcs[scheme]; dup {
		panic("dlock: Register called twice for scheme " + scheme)
	}
	funcs[scheme] = open
}

// Lookup returns what was registered under scheme, or nil.
func Lookup(scheme string) any {
	mu.RLock()
	defer mu.RUnlock()
	return funcs[scheme]
}

// Schemes lists the registered schemes, sorted.
func Schemes() []string {
	mu.RLock()
	defer mu.RUnlock()
	s := make([]string, 0, len(funcs))
	for k := range funcs {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}
