package servers

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestBuildFailure proves that a failing build step is reported as an error
// with the build's output, though the engine answers it with a 200 reply.
func TestBuildFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	client, err := dockerClient(ctx)
	if err != nil {
		requireFailed(t, Redis, err)
	}
	var buildCtx bytes.Buffer
	tw := tar.NewWriter(&buildCtx)
	dockerfile := "FROM " + baseImage + "\nRUN echo dlock-build-step && exit 3\n"
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(dockerfile))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(dockerfile)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	tag := "dlock-test-broken:" + randomHex(4)
	out, err := client.buildImage(ctx, tag, map[string]string{LabelKind: "broken"}, &buildCtx)
	if err == nil {
		t.Errorf("building a Dockerfile whose RUN exits 3: got no error, want one")
	} else if !strings.Contains(err.Error(), "3") || !strings.Contains(out, "dlock-build-step") {
		t.Errorf("got error %v and output %q, want the exit code and the step's output", err, out)
	}
	if ok, err := client.imageExists(ctx, tag); err != nil || ok {
		t.Errorf("image %s after a failed build: exists %v, err %v; want none", tag, ok, err)
	}
}

// TestDemux proves that the framing of a container's log stream is removed,
// and that an unframed stream is kept as it is.
func TestDemux(t *testing.T) {
	frame := func(stream byte, s string) []byte {
		b := []byte{stream, 0, 0, 0}
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		return append(b, s...)
	}
	var framed []byte
	framed = append(framed, frame(1, "out\n")...)
	framed = append(framed, frame(2, "err: a longer line\n")...)
	for _, tc := range []struct{ name, in, want string }{
		{"framed", string(framed), "out\nerr: a longer line\n"},
		{"raw", "plain text from a TTY\n", "plain text from a TTY\n"},
		{"empty", "", ""},
	} {
		got, err := demux(strings.NewReader(tc.in))
		if err != nil || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// TestRetryEngine proves that a pause or unpause the engine fails with a
// server error is tried again, a bounded number of times, and that other
// errors are not; a conflict saying the earlier try took effect is success.
func TestRetryEngine(t *testing.T) {
	freeze := &apiError{op: "POST /containers/x/pause", status: 500, msg: "Cannot pause container x: OCI runtime pause failed: unable to freeze: unknown"}
	paused := &apiError{op: "POST /containers/x/pause", status: 409, msg: "Container x is already paused"}
	missing := &apiError{op: "POST /containers/x/pause", status: 404, msg: "No such container: x"}
	for _, tc := range []struct {
		name    string
		replies []error // the last one repeats
		calls   int
		ok      bool
	}{
		{"transient", []error{freeze, freeze, nil}, 3, true},
		{"persistent", []error{freeze}, engineTries, false},
		{"not transient", []error{missing}, 1, false},
		{"took effect after all", []error{freeze, paused}, 2, true},
		{"conflict at first", []error{paused}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := retryEngine(t.Context(), func() error {
				calls++
				return tc.replies[min(calls, len(tc.replies))-1]
			}, "already paused")
			if calls != tc.calls || (err == nil) != tc.ok {
				t.Errorf("got %d calls and %v; want %d calls, success %v", calls, err, tc.calls, tc.ok)
			}
			if err != nil && !errors.Is(err, tc.replies[len(tc.replies)-1]) {
				t.Errorf("got %v; want the engine's error in the chain", err)
			}
		})
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	calls := 0
	err := retryEngine(ctx, func() error { calls++; return freeze }, "already paused")
	if calls != 1 || !errors.Is(err, context.Canceled) || !errors.Is(err, freeze) {
		t.Errorf("with ctx ended: got %d calls and %v; want 1 call and both errors", calls, err)
	}
}
