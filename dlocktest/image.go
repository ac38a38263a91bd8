package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sync"
)

// Image is a server kind this package does not ship: the backend of a
// third-party driver, made known to [Start], [Shared], [Require] and
// [BuildImages] by [Register]. A registered kind is built, started,
// faulted, reaped and pointed at an external server (DLOCK_<KIND>_ADDR,
// with '-' read as '_') exactly as the kinds in [Kinds] are.
type Image struct {
	// Kind names the kind, its image (dlock-<kind>:<hash>) and its
	// containers: a lowercase letter, then up to 31 lowercase letters,
	// digits and '-'. It must not be one of [Kinds] or already registered.
	Kind Kind

	// Context is the image's build context: a file named Dockerfile at its
	// root, FROM debian:bookworm-slim (nothing is pulled), and any file it
	// copies. The image's tag is a hash of these files, so a changed
	// Dockerfile makes a new image.
	Context fs.FS

	// Port is the server's TCP port inside the container. It is published on
	// 127.0.0.1 only, at a port picked when the server starts.
	Port int

	// Ping is the server's health check, one attempt against addr
	// (host:port) bounded by ctx: nil when the server accepts clients.
	// Start calls it until it succeeds; [Server.Ping] calls it once. It
	// should speak the protocol's smallest exchange on a connection of its
	// own, and never send a credential it would echo in its error.
	Ping func(ctx context.Context, addr string) error
}

// ErrInvalidImage is wrapped by Register's error for an Image it refuses;
// nothing is registered then.
var ErrInvalidImage = errors.New("dlocktest: invalid image")

// kindSpec is what the package needs of a kind: how to build it, the port
// to publish and how to tell it is up.
type kindSpec struct {
	context func() (fs.FS, error)
	port    string // as Docker names it: "6379/tcp"
	ping    func(ctx context.Context, addr string) error
}

// builtin is the spec of each kind in Kinds: its folder of the embedded
// images, its port and its health check (ping.go).
var builtin = map[Kind]kindSpec{
	Redis:     {embedded(Redis), "6379/tcp", pingRedis},
	Etcd:      {embedded(Etcd), "2379/tcp", pingEtcd},
	ZooKeeper: {embedded(ZooKeeper), "2181/tcp", pingZooKeeperRW},
	Postgres:  {embedded(Postgres), "5432/tcp", pingPostgres},
	MariaDB:   {embedded(MariaDB), "3306/tcp", pingMariaDB},
}

// embedded returns the build context of a built-in kind.
func embedded(kind Kind) func() (fs.FS, error) {
	return func() (fs.FS, error) { return fs.Sub(images, path.Join("images", string(kind))) }
}

var (
	customMu sync.Mutex
	custom   = map[Kind]kindSpec{}
)

// Register makes img's kind known to this package, for the rest of the
// process. It checks img before any call to Docker (the image is built on
// first use, or by BuildImages) and returns an error wrapping
// [ErrInvalidImage] for a kind that is malformed or already known, a
// Context without a Dockerfile, a Port outside 1-65535 or a nil Ping.
// Registering is safe for concurrent use; a test binary registers its
// kinds in TestMain or in an init function.
func Register(img Image) error {
	if err := checkImage(img); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidImage, err)
	}
	customMu.Lock()
	defer customMu.Unlock()
	if _, ok := custom[img.Kind]; ok {
		return fmt.Errorf("%w: kind %q is already registered", ErrInvalidImage, img.Kind)
	}
	ctxFS := img.Context
	custom[img.Kind] = kindSpec{
		context: func() (fs.FS, error) { return ctxFS, nil },
		port:    fmt.Sprintf("%d/tcp", img.Port),
		ping:    img.Ping,
	}
	return nil
}

func checkImage(img Image) error {
	k := string(img.Kind)
	if k == "" || len(k) > 32 || k[0] < 'a' || k[0] > 'z' {
		return fmt.Errorf("kind %q must be a lowercase letter, then up to 31 lowercase letters, digits and '-'", k)
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("kind %q must be a lowercase letter, then up to 31 lowercase letters, digits and '-'", k)
		}
	}
	if _, ok := builtin[img.Kind]; ok {
		return fmt.Errorf("kind %q is one of dlocktest's own", k)
	}
	if img.Context == nil {
		return fmt.Errorf("kind %q has no build context", k)
	}
	if st, err := fs.Stat(img.Context, "Dockerfile"); err != nil || st.IsDir() {
		return fmt.Errorf("kind %q: its build context has no Dockerfile at its root", k)
	}
	if img.Port < 1 || img.Port > 65535 {
		return fmt.Errorf("kind %q: port %d is not in 1-65535", k, img.Port)
	}
	if img.Ping == nil {
		return fmt.Errorf("kind %q has no Ping", k)
	}
	return nil
}

// spec returns kind's spec, or an error wrapping ErrUnknownKind that lists
// the known kinds.
func spec(kind Kind) (kindSpec, error) {
	if s, ok := builtin[kind]; ok {
		return s, nil
	}
	customMu.Lock()
	defer customMu.Unlock()
	if s, ok := custom[kind]; ok {
		return s, nil
	}
	known := slices.Clone(Kinds)
	for k := range custom {
		known = append(known, k)
	}
	slices.Sort(known[len(Kinds):])
	return kindSpec{}, fmt.Errorf("%w %q (known: %v)", ErrUnknownKind, kind, known)
}
