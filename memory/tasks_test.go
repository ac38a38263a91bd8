package memory_test

import (
	"context"
	"testing"

	"github.com/dlock/dlock/memory"
	"github.com/dlock/dlock/queue"
	"github.com/dlock/dlock/queue/conformance"
)

type queueHarness struct{ s *memory.Store }

func (h queueHarness) NewClient(t *testing.T) (*queue.Client, conformance.Faults) {
	link := memory.NewLink()
	return memory.NewQueue(h.s, link), link
}

func (h queueHarness) Residue(_ context.Context, name string) ([]string, error) {
	return h.s.QueuedIDs(name), nil
}

// The memory driver passes the task-queue suite.
func TestQueueConformance(t *testing.T) {
	conformance.Run(t, queueHarness{memory.NewStore()})
}
