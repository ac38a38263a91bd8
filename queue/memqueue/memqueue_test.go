package memqueue_test

import (
	"context"
	"testing"

	"github.com/dlock/dlock/memory"
	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/queue/conformance"
	"github.com/dlock/dlock/queue/memqueue"
)

type queueHarness struct{ s *memory.Store }

func (h queueHarness) NewClient(t *testing.T) (*queue.Client, conformance.Faults) {
	link := memory.NewLink()
	return memqueue.NewQueue(h.s, link), link
}

func (h queueHarness) Residue(_ context.Context, name string) ([]string, error) {
	return memqueue.QueuedIDs(h.s, name), nil
}

// The memory driver passes the task-queue suite.
func TestQueueConformance(t *testing.T) {
	conformance.Run(t, queueHarness{memory.NewStore()})
}
