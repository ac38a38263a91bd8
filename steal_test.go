package dlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock/dlock"
)

// Steal on a driver that cannot take a lock over fails with
// errors.ErrUnsupported before asking the driver anything; bad input fails
// with ErrInvalid.
func TestStealUnsupported(t *testing.T) {
	d := &lossDriver{handles: make(chan *lossHandle, 1)}
	l, err := dlock.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, err := l.Steal(context.Background(), "x", nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Steal on a driver without Stealer: %v; want errors.ErrUnsupported", err)
	}
	if len(d.handles) > 0 {
		t.Error("the driver was asked for a lock")
	}
}

func TestStealInvalid(t *testing.T) {
	l, err := dlock.Open(context.Background(), "mem://steal-invalid")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, err := l.Steal(context.Background(), "", nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Steal of an empty name: %v; want ErrInvalid", err)
	}
	if _, err := l.Steal(context.Background(), "x", &dlock.Options{TTL: -1}); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Steal with a negative TTL: %v; want ErrInvalid", err)
	}
}
