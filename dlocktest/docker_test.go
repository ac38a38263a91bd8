package dlocktest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	dc "github.com/ory/dockertest/v3/docker"
)

// TestBuildFailure proves that a failing build step is reported as an error
// with the build's output, though the engine answers it with a 200 reply.
func TestBuildFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	e, err := engine(ctx)
	if err != nil {
		requireFailed(t, "Docker", err)
	}
	ctxFS := fstest.MapFS{"Dockerfile": {Data: []byte("FROM " + baseImage + "\nRUN echo dlock-build-step && exit 3\n")}}
	tag := "dlock-test-broken:" + randomHex(4)
	out, err := e.build(ctx, ctxFS, tag, map[string]string{LabelKind: "broken"})
	if err == nil {
		t.Errorf("building a Dockerfile whose RUN exits 3: got no error, want one")
	} else if !strings.Contains(err.Error(), "3") || !strings.Contains(out, "dlock-build-step") {
		t.Errorf("got error %v and output %q, want the exit code and the step's output", err, out)
	}
	if ok, err := e.imageExists(tag); err != nil || ok {
		t.Errorf("image %s after a failed build: exists %v, err %v; want none", tag, ok, err)
	}
}

// TestBuildImages proves that an unknown kind is refused before any call to
// Docker, and that after BuildImages every kind's image exists under the tag
// Start looks for.
func TestBuildImages(t *testing.T) {
	if err := BuildImages(t.Context(), Redis, "redsi"); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("BuildImages(redis, redsi) = %v, want ErrUnknownKind", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	if err := BuildImages(ctx); err != nil {
		requireFailed(t, "the server images", err)
	}
	e, err := engine(ctx)
	if err != nil {
		requireFailed(t, "Docker", err)
	}
	for _, kind := range Kinds {
		_, tag, err := imageContext(kind)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := e.imageExists(tag); err != nil || !ok {
			t.Errorf("image %s after BuildImages: exists %v, err %v; want it", tag, ok, err)
		}
	}
}

// TestRetryFault proves that an engine call of a fault is retried on the
// engine's 500 ("OCI runtime pause failed: unable to freeze"), a bounded
// number of times, that other errors are not retried, and that what remains
// is reported as the harness's (ErrFault).
func TestRetryFault(t *testing.T) {
	freeze := &dc.Error{Status: http.StatusInternalServerError, Message: "Cannot pause container x: OCI runtime pause failed: unable to freeze: unknown"}
	for _, tc := range []struct {
		name      string
		errs      []error // returned by successive calls; nil after the list
		wantCalls int
		wantErr   bool
	}{
		{"ok", nil, 1, false},
		{"transient then ok", []error{freeze, freeze}, 3, false},
		{"transient throughout", []error{freeze, freeze, freeze, freeze, freeze, freeze}, faultAttempts, true},
		{"conflict", []error{&dc.Error{Status: http.StatusConflict, Message: "is already paused"}}, 1, true},
		{"not paused, older engines' 500", []error{&dc.Error{Status: http.StatusInternalServerError, Message: "Container x is not paused"}}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := retryFault(t.Context(), func() error {
				calls++
				if calls <= len(tc.errs) {
					return tc.errs[calls-1]
				}
				return nil
			})
			if calls != tc.wantCalls {
				t.Errorf("calls: got %d, want %d", calls, tc.wantCalls)
			}
			if (err != nil) != tc.wantErr || err != nil && !errors.Is(err, ErrFault) {
				t.Errorf("got %v, want an error wrapping ErrFault: %v", err, tc.wantErr)
			}
		})
	}
}
