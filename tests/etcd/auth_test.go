package etcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/servers"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// With etcd authentication on, a user with read-write permission on the
// prefix locks and unlocks through an etcd://user:pass@ URL; a wrong
// password or a prefix outside the permission fails at Open, and no error
// shows the password.
func TestOpenAuth(t *testing.T) {
	ctx := testCtx(t)
	srv := servers.RequireNewWith(t, servers.Etcd, &servers.StartOptions{Env: fastElection})
	root := newClient(t, srv.Addr())
	const rootPW, userPW = "r00t-pw", "us3r/p@ss"
	steps := []func() error{
		func() error { _, err := root.RoleAdd(ctx, "root"); return err },
		func() error { _, err := root.UserAdd(ctx, "root", rootPW); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "lockers"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "lockers", "/app/", clientv3.GetPrefixRangeEnd("/app/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "locker", userPW); return err },
		func() error { _, err := root.UserGrantRole(ctx, "locker", "lockers"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth set-up step %d: %v", i, err)
		}
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Addr()}, Username: "root", Password: rootPW, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	base := "etcd://locker:" + strings.ReplaceAll(userPW, "/", "%2F") + "@" + srv.Addr()
	l, err := dlock.Open(ctx, base+"/app/")
	if err != nil {
		t.Fatalf("Open as a permitted user: %v", err)
	}
	if _, err := l.TryAcquire(ctx, "job", nil); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.Get(ctx, "/app/job/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 1 {
		t.Fatalf("lock key on the server: %v, %v", resp, err)
	}
	if err := l.Close(ctx); err != nil { // releases, revokes the idle lease
		t.Fatal(err)
	}
	resp, err = admin.Get(ctx, "/app/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("keys left: %v, %v", resp, err)
	}

	for _, bad := range []string{
		"etcd://locker:wr0ng-pw@" + srv.Addr() + "/app/", // wrong password
		base + "/other/", // no permission there
	} {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := dlock.Open(cctx, bad)
		cancel()
		if err == nil {
			_ = l.Close(ctx)
			t.Errorf("Open(%s) succeeded", bad)
			continue
		}
		if errors.Is(err, dlock.ErrInvalid) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Open(%s): %v; want the server's refusal", bad, err)
		}
		for _, pw := range []string{"wr0ng", "us3r", "p@ss"} {
			if strings.Contains(err.Error(), pw) {
				t.Errorf("Open(%s): the error shows the password: %v", bad, err)
			}
		}
	}
}
