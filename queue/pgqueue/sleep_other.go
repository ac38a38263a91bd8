//go:build !linux

package pgqueue

import "time"

// sleepPrecisely sleeps for d (precisely on Linux only; see
// sleep_linux.go).
func sleepPrecisely(d time.Duration) { time.Sleep(d) }
