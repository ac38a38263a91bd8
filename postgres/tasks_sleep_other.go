//go:build !linux

package postgres

import "time"

// sleepPrecisely sleeps for d (precisely on Linux only; see
// tasks_sleep_linux.go).
func sleepPrecisely(d time.Duration) { time.Sleep(d) }
