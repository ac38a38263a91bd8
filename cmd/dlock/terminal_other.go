//go:build !linux

package main

import "os"

// fileIsTerminal takes a character device for a terminal.
func fileIsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
