package redis_test

import (
	"syscall"
	"time"
	"unsafe"
)

// processCPU is the CPU time the process has used, all threads together
// (CLOCK_PROCESS_CPUTIME_ID, to the nanosecond): in a benchmark that runs
// one cycle at a time, the difference around a cycle is what that cycle
// cost, whoever else shares the machine.
func processCPU() time.Duration {
	const clockProcessCPUTimeID = 2
	var ts syscall.Timespec
	_, _, _ = syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockProcessCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}
