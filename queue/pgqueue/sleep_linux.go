package pgqueue

import (
	"syscall"
	"time"
)

// sleepPrecisely blocks the calling goroutine's thread in nanosleep for d:
// the kernel's timers wake it within about 0.1ms, where Go's own sleep
// through its network poller may be up to 1ms late. Used for at most
// 2*earlyWake.
func sleepPrecisely(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
