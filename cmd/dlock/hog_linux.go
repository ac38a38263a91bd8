package main

import "syscall"

// hogAttr has the kernel kill a -hog process when dlock exits.
func hogAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
