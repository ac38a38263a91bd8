// Command buildimages builds the dlocktest server images that are missing,
// all at once: every kind, or the kinds named as arguments (redis, etcd,
// zookeeper, postgres, mariadb). scripts/test.sh and scripts/bench.sh run it
// beside their other first steps, so that a fresh machine installs the five
// servers side by side instead of one after another as tests first need them.
//
//	go run github.com/dlock/dlock/dlocktest/cmd/buildimages [kind...]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/dlock/dlock/dlocktest"
)

func main() {
	var kinds []dlocktest.Kind
	for _, a := range os.Args[1:] {
		kinds = append(kinds, dlocktest.Kind(a))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	if err := dlocktest.BuildImages(ctx, kinds...); err != nil {
		fmt.Fprintln(os.Stderr, "buildimages:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "buildimages: images ready in %s\n", time.Since(start).Round(100*time.Millisecond))
}
