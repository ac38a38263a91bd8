// Package reach tells at once that no server of a list accepts connections,
// for drivers whose clients would retry a refused connection until their
// dial timeout.
package reach

import (
	"context"
	"errors"
	"net"
	"time"
)

// Any returns nil as soon as one of addrs (host:port) accepts a TCP
// connection, and otherwise the errors of all of them, which name the
// addresses. ctx and timeout bound it.
func Any(ctx context.Context, addrs []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	errs := make(chan error, len(addrs))
	for _, addr := range addrs {
		go func() {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				_ = c.Close()
			}
			errs <- err
		}()
	}
	var all []error
	for range addrs {
		err := <-errs
		if err == nil {
			return nil
		}
		all = append(all, err)
	}
	return errors.Join(all...)
}
