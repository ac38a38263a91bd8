package etcd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
)

// Open a Locker from a URL: three endpoints, keys under "/locks/", a 10s
// TTL.
func Example_open() {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks/?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(ctx)

	ls, err := l.Acquire(ctx, "nightly-report", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ls.Release(ctx)
	fence, _ := ls.Fence() // the key's create revision
	fmt.Println("holding with fence", fence)
}

// Build a Locker on a client the application already has.
func ExampleNew() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	l, err := etcd.New(client, &etcd.Options{KeyPrefix: "/locks/", Defaults: dlock.Options{TTL: 10 * time.Second}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
}

// A dlock lock and a concurrency.Mutex (or `etcdctl lock /locks/job`)
// exclude each other when the Mutex is made with MutexName.
func ExampleMutexName() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	s, err := concurrency.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, etcd.MutexName("/locks/", "job")) // "/locks/job"
	if err := m.Lock(context.Background()); err != nil {
		log.Fatal(err)
	}
	defer m.Unlock(context.Background())
}

// A dlock read/write lock and etcd's recipe.RWMutex exclude each other when
// the RWMutex is made with RWMutexName.
func ExampleRWMutexName() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	s, err := concurrency.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	m := recipe.NewRWMutex(s, etcd.RWMutexName("/locks/", "config")) // "/locks/%rwlock/config"
	if err := m.RLock(); err != nil {
		log.Fatal(err)
	}
	defer m.RUnlock()
}

// An etcd concurrency.Election and dlock's Elect on the same name campaign
// in one queue; dlock's Leader names an etcd candidate too.
func ExampleMutexName_election() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	l, err := etcd.New(client, &etcd.Options{KeyPrefix: "/locks/"})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	s, err := concurrency.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	e := concurrency.NewElection(s, etcd.MutexName("/locks/", "scheduler"))
	if err := e.Campaign(context.Background(), "host-a"); err != nil {
		log.Fatal(err)
	}
	ld, err := l.Leader(context.Background(), "scheduler")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ld.Candidate, ld.Term == uint64(e.Rev()))
}
