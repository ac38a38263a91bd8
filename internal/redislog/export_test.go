package redislog

import "io"

// SetOutput sends the lines that are not dlock's to w, and returns a function
// that restores stderr.
func SetOutput(w io.Writer) (restore func()) {
	outMu.Lock()
	prev := out
	out = w
	outMu.Unlock()
	return func() {
		outMu.Lock()
		out = prev
		outMu.Unlock()
	}
}
