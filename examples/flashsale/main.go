// Command flashsale runs a flash sale ("seckill") where many buyers race
// for a few items. Orders go
// through a task queue; a pool of workers claims them and fulfils each under
// a lock on the stock, writing with the lease's fencing token to a store
// that refuses stale tokens. At the end it prints what was sold, what was
// oversold (0) and how many orders were lost (0), and the throughput.
//
//	go run ./examples/flashsale                         # in process (mem://)
//	go run ./examples/flashsale -url redis://127.0.0.1:6379/0
//	go run ./examples/flashsale -url 'postgres://user:pass@127.0.0.1:5432/db'
//
// The same URL opens the lock (dlock.Open) and the queue (queue.Open).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/queue"

	_ "github.com/dlock/dlock/memory"
	_ "github.com/dlock/dlock/postgres"
	_ "github.com/dlock/dlock/queue/memqueue"
	_ "github.com/dlock/dlock/queue/pgqueue"
	_ "github.com/dlock/dlock/queue/redisqueue"
	_ "github.com/dlock/dlock/redis"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// Result is what a sale ends with.
type Result struct {
	Orders, Items, Sold, Rejected, Oversold, Lost int
	Elapsed                                       time.Duration
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("flashsale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "mem://", "the backend, for both the lock and the queue: mem://, redis://…, postgres://…")
	buyers := fs.Int("buyers", 1000, "buyers, one order each")
	items := fs.Int("items", 10, "items in stock")
	workers := fs.Int("workers", 4, "workers fulfilling orders, each with its own connections")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	res, err := sale(ctx, *url, *buyers, *items, *workers)
	if err != nil {
		fmt.Fprintln(stderr, "flashsale:", err)
		return 1
	}
	fmt.Fprintf(stdout, "orders=%d items=%d sold=%d rejected=%d oversold=%d lost=%d in %v (%.0f orders/s)\n",
		res.Orders, res.Items, res.Sold, res.Rejected, res.Oversold, res.Lost,
		res.Elapsed.Round(time.Millisecond), float64(res.Orders)/res.Elapsed.Seconds())
	if res.Sold != res.Items || res.Oversold != 0 || res.Lost != 0 {
		return 1
	}
	return 0
}

// store is the stock, guarded by fencing tokens: a write with a token lower
// than the highest it has accepted is refused (a worker whose lease was lost
// and who did not notice cannot sell an item twice).
type store struct {
	mu       sync.Mutex
	stock    int
	sold     map[string]bool
	rejected map[string]bool // orders turned away: sold out
	highest  uint64
	refused  int
}

var errStale = errors.New("stale fencing token")

// sell takes one item for order under fence; it returns false when sold
// out.
func (s *store) sell(fence uint64, order string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence < s.highest {
		s.refused++
		return false, errStale
	}
	s.highest = fence
	if s.sold[order] { // a redelivered order already fulfilled: idempotent
		return true, nil
	}
	if s.stock == 0 {
		s.rejected[order] = true
		return false, nil
	}
	s.stock--
	s.sold[order] = true
	return true, nil
}

func sale(ctx context.Context, url string, buyers, items, workers int) (Result, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	run := hex.EncodeToString(b[:])
	st := &store{stock: items, sold: map[string]bool{}, rejected: map[string]bool{}}
	res := Result{Orders: buyers, Items: items}

	qc, err := queue.Open(ctx, url)
	if err != nil {
		return res, err
	}
	defer qc.Close()
	orders, err := qc.Queue("flashsale:"+run+":orders", nil)
	if err != nil {
		return res, err
	}
	start := time.Now()

	// The buyers race: every order goes through the queue (deduplicated by
	// the order's id).
	var bwg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var enqErr atomic.Value
	for i := range buyers {
		bwg.Add(1)
		sem <- struct{}{}
		go func() {
			defer bwg.Done()
			defer func() { <-sem }()
			if _, err := orders.Enqueue(ctx, fmt.Sprintf("order-%05d", i), &queue.EnqueueOptions{Payload: []byte(fmt.Sprint(i))}); err != nil {
				enqErr.Store(err)
			}
		}()
	}

	// The workers: claim orders, fulfil each under the stock's lock.
	var (
		done     atomic.Int64
		wg       sync.WaitGroup
		errs     = make(chan error, workers)
		lockName = "flashsale:" + run + ":stock"
	)
	for range workers {
		l, err := dlock.Open(ctx, url)
		if err != nil {
			return res, err
		}
		defer l.Close(context.Background())
		wc, err := queue.Open(ctx, url)
		if err != nil {
			return res, err
		}
		defer wc.Close()
		q, _ := wc.Queue(orders.Name(), nil)
		wg.Go(func() {
			for done.Load() < int64(buyers) {
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				claims, err := q.ClaimWait(wctx, 10, 30*time.Second)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				for _, c := range claims {
					err := fulfil(ctx, l, lockName, st, c)
					if errors.Is(err, queue.ErrClaimLost) {
						continue // it comes back to a worker; selling is idempotent
					}
					if err != nil {
						errs <- err
						return
					}
					done.Add(1)
				}
			}
		})
	}
	bwg.Wait()
	wg.Wait()
	res.Elapsed = time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	if err, _ := enqErr.Load().(error); err != nil {
		return res, err
	}
	st.mu.Lock()
	res.Sold = len(st.sold)
	res.Rejected = len(st.rejected)
	st.mu.Unlock()
	res.Oversold = max(0, res.Sold-items)
	res.Lost = buyers - res.Sold - res.Rejected
	return res, nil
}

// fulfil sells an item for the order (or turns it away, sold out) under the
// stock's lock, then acks it.
func fulfil(ctx context.Context, l *dlock.Locker, lockName string, st *store, c *queue.Claim) error {
	return dlock.Do(ctx, l, lockName, nil, func(ctx context.Context, ls *dlock.Lease) error {
		fence, _ := ls.Fence()
		if _, err := st.sell(fence, c.ID); err != nil {
			return err
		}
		return c.Ack(ctx)
	})
}
