package main

import (
	"os"

	sysunix "golang.org/x/sys/unix"
)

// fileIsTerminal asks the kernel (TCGETS), so that /dev/null, a character
// device too, is not taken for a terminal.
func fileIsTerminal(f *os.File) bool {
	_, err := sysunix.IoctlGetTermios(int(f.Fd()), sysunix.TCGETS)
	return err == nil
}
