package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// progressWriter shows the bench's progress lines ("[3/16] etcd dlock
// contended …"): on a terminal as one line rewritten in place, failures
// kept as lines of their own; elsewhere (a log file, CI) one line each, as
// written.
type progressWriter struct {
	w   io.Writer
	tty bool

	mu      sync.Mutex
	partial []byte
	open    bool // a progress line is shown without its newline
}

func newProgress(w io.Writer) *progressWriter { return &progressWriter{w: w, tty: isTerminal(w)} }

func (p *progressWriter) Write(b []byte) (int, error) {
	if !p.tty {
		return p.w.Write(b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		line := string(p.partial[:i])
		p.partial = p.partial[i+1:]
		if strings.Contains(line, "FAILED") {
			fmt.Fprintf(p.w, "\r\033[K%s\n", line)
			p.open = false
			continue
		}
		if len(line) > 150 {
			line = line[:149] + "…"
		}
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.open = true
	}
	return len(b), nil
}

// Close ends the progress line on a terminal.
func (p *progressWriter) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && f != nil && fileIsTerminal(f)
}
