package pgqueue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dlock/dlock"
)

// Acks are batched, as river batches its completions: each statement is a
// transaction, and a worker loop's Ack is most of what a task costs the
// server beyond its claim. An Ack joins its queue's pending acks; when no
// batch of the queue is running, it starts one at once, so a lone Ack waits
// for nothing, and Acks that arrive while a batch runs go together in the
// next, of at most maxAckBatch (bounded in size, and in latency by one
// batch's statement). Each ack in a batch is checked as a lone Ack is: the
// row is deleted only if its (id, token) pair is one of the batch's and
// its claim is current (ackBatchSQL).

// maxAckBatch bounds the acks one statement carries.
const maxAckBatch = 256

// ackBatchSQL deletes the current claims of a batch ($1 queue, $2 ids, $3
// their tokens, pairwise) and returns the (id, token) of each it deleted.
// The rows are found through the primary key (queue, id = ANY): state is
// compared as an int, as in current, so that the (queue, state, due, id)
// index offers no range.
const ackBatchSQL = `DELETE FROM dlock_tasks WHERE queue = $1 AND id = ANY($2::text[])
	AND state::int = 1 AND due > now()
	AND (id, token) IN (SELECT * FROM unnest($2::text[], $3::text[]))
	RETURNING id, token`

// ackReq is one pending Ack.
type ackReq struct {
	ctx       context.Context
	id, token string
	done      chan ackResult // 1-buffered
}

type ackResult struct {
	ok  bool
	err error
}

// ackQueue is one queue's pending acks.
type ackQueue struct {
	pending []*ackReq
	running bool // a batch goroutine is running (it takes pending)
}

// ack runs an Ack through the queue's batches.
func (d *taskDriver) ack(ctx context.Context, qn, id, token string) (bool, error) {
	if err := d.ensure(ctx); err != nil {
		return false, err
	}
	r := &ackReq{ctx: ctx, id: id, token: token, done: make(chan ackResult, 1)}
	d.amu.Lock()
	if d.aclosed {
		d.amu.Unlock()
		return false, fmt.Errorf("postgres: ack on %q: %w", qn, dlock.ErrClosed)
	}
	aq := d.acks[qn]
	if aq == nil {
		aq = &ackQueue{}
		d.acks[qn] = aq
	}
	aq.pending = append(aq.pending, r)
	if !aq.running {
		aq.running = true
		d.awg.Add(1)
		go d.ackBatches(qn, aq)
	}
	d.amu.Unlock()
	select {
	case res := <-r.done:
		return res.ok, res.err
	case <-ctx.Done():
		// The ack may still be sent, or have been: like a statement cut
		// off, it happened or not.
		return false, fmt.Errorf("postgres: ack on %q: %w", qn, ctx.Err())
	}
}

// ackBatches runs the queue's batches while acks are pending.
func (d *taskDriver) ackBatches(qn string, aq *ackQueue) {
	defer d.awg.Done()
	for {
		d.amu.Lock()
		batch := takeAckBatch(aq)
		if len(batch) == 0 {
			aq.running = false
			if len(aq.pending) == 0 && d.acks[qn] == aq {
				delete(d.acks, qn)
			}
			d.amu.Unlock()
			return
		}
		d.amu.Unlock()
		d.runAckBatch(qn, batch)
	}
}

// takeAckBatch takes up to maxAckBatch pending acks whose callers still
// wait, each (id, token) once (a repeated one waits for the next batch,
// so that only one of them is told it acked); d.amu is held. Acks whose
// ctx has ended are dropped.
func takeAckBatch(aq *ackQueue) []*ackReq {
	var (
		batch []*ackReq
		rest  []*ackReq
		seen  = map[[2]string]bool{}
	)
	for _, r := range aq.pending {
		k := [2]string{r.id, r.token}
		switch {
		case r.ctx.Err() != nil:
			r.done <- ackResult{err: r.ctx.Err()}
		case seen[k] || len(batch) == maxAckBatch:
			rest = append(rest, r)
		default:
			seen[k] = true
			batch = append(batch, r)
		}
	}
	aq.pending = rest
	return batch
}

// runAckBatch runs one batch's statement, under a context that ends when
// every caller in the batch has stopped waiting, and tells each caller
// whether its claim was acked.
func (d *taskDriver) runAckBatch(qn string, batch []*ackReq) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waiting atomic.Int64
	waiting.Store(int64(len(batch)))
	for _, r := range batch {
		stop := context.AfterFunc(r.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	ids, tokens := make([]string, len(batch)), make([]string, len(batch))
	for i, r := range batch {
		ids[i], tokens[i] = r.id, r.token
	}
	acked := map[[2]string]bool{}
	rows, err := d.pool.Query(ctx, d.ackSQL, qn, ids, tokens)
	if err == nil {
		for rows.Next() {
			var id, token string
			if err = rows.Scan(&id, &token); err != nil {
				break
			}
			acked[[2]string{id, token}] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for _, r := range batch {
		if err != nil {
			r.done <- ackResult{err: fmt.Errorf("postgres: ack on %q: %w", qn, err)}
			continue
		}
		r.done <- ackResult{ok: acked[[2]string{r.id, r.token}]}
	}
}

// closeAcks refuses new acks and waits for the running batches.
func (d *taskDriver) closeAcks() {
	d.amu.Lock()
	d.aclosed = true
	d.amu.Unlock()
	d.awg.Wait()
}

// ackState is the driver's batching state (see ack).
type ackState struct {
	amu     sync.Mutex
	acks    map[string]*ackQueue // by queue
	aclosed bool
	awg     sync.WaitGroup // the running batch goroutines
	ackSQL  string
}
