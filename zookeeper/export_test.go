package zookeeper

import "time"

// SetIdleAfter replaces how long an unused session stays open, for a test;
// it returns a function restoring it.
func SetIdleAfter(d time.Duration) (restore func()) {
	old := idleAfter
	idleAfter = func(time.Duration) time.Duration { return d }
	return func() { idleAfter = old }
}
