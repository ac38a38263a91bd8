package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultKeyPrefix is the key prefix when none is given.
const DefaultKeyPrefix = "dlock/"

// MinTTL is the shortest TTL the driver accepts: etcd leases count in whole
// seconds. The server may raise it further (see the package doc).
const MinTTL = time.Second

// ExpirySlack is how long after a dead holder's ValidUntil its key may still
// be there: etcd revokes expired leases every 500ms.
const ExpirySlack = time.Second

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// Defaults are the Locker's default lock options (URL: ttl, refresh,
	// refresh_interval, retry_min, retry_max, metadata). Zero fields mean the
	// defaults documented on dlock.Options.
	Defaults dlock.Options

	// KeyPrefix starts every key (URL: the path). Default "dlock/". It is
	// used verbatim: end it with "/" to keep it apart from other keys.
	KeyPrefix string

	// LeasePerLock binds each lock's key to an etcd lease of its own, as
	// before shared etcd leases: a grant per acquisition (or an idle one
	// reused), a revocation per release beyond 16 idle ones, and a renewal
	// and a read per lock and refresh. Default false: the locks of one TTL
	// share one etcd lease (see the package doc). Semaphores and read/write
	// locks always have one each. URL: lease_per_lock=true.
	LeasePerLock bool
}

// New returns a Locker on the application's client. Closing the Locker does
// not close the client.
func New(client *clientv3.Client, opts *Options) (*dlock.Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: etcd: nil client", dlock.ErrInvalid)
	}
	d := newDriver(client, opts, false)
	return dlock.New(d, &d.defaults)
}

// newDriver returns the driver. open passes a nil client, which Ping makes
// once the options are known to be valid.
func newDriver(client *clientv3.Client, opts *Options, ownsClient bool) *driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	d := &driver{
		c:          client,
		prefix:     o.KeyPrefix,
		ownsClient: ownsClient,
		pool:       make(map[int64][]*lease),
		attempts:   make(map[string]*lease),
		perLock:    o.LeasePerLock,
	}
	d.reg.keys = make(map[string]*handle)
	d.reg.ids = make(map[clientv3.LeaseID]bool)
	d.reg.shared = make(map[int64]*lease)
	d.reg.moved = make(chan struct{})
	d.reg.marker = o.KeyPrefix + markerSpace + newID()
	d.defaults = o.Defaults
	return d
}

// MutexName returns the name under which concurrency.NewMutex and `etcdctl
// lock` contend with dlock's lock on name, for the given key prefix ("" for
// the default).
func MutexName(keyPrefix, name string) string {
	if keyPrefix == "" {
		keyPrefix = DefaultKeyPrefix
	}
	return keyPrefix + escape(name)
}

// escape writes "%" as "%25" and "/" as "%2F", so that no name's keys lie
// under another's prefix.
func escape(name string) string {
	if !strings.ContainsAny(name, "%/") {
		return name
	}
	return strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
}

type driver struct {
	c          *clientv3.Client
	prefix     string
	ownsClient bool
	defaults   dlock.Options    // New's Options.Defaults
	cfg        *clientv3.Config // opened from a URL: Ping makes c from it
	addr       string           // the redacted URL, when opened from one

	mu       sync.Mutex
	closed   bool
	pool     map[int64][]*lease // idle etcd leases by TTL in seconds
	attempts map[string]*lease  // by token: failed TryAcquires, for Abandon
	bg       sync.WaitGroup     // revocations in flight

	perLock bool     // Options.LeasePerLock
	reg     registry // shared etcd leases and the Locker's watch
	group   grouper  // acquisitions and releases grouped in requests
}

func (d *driver) Capabilities() dlock.Capabilities {
	return dlock.Capabilities{
		Fencing:         true,
		FIFO:            true,
		NotifiedWait:    true,
		MinTTL:          MinTTL,
		SurvivesRestart: true,
		ExpirySlack:     ExpirySlack,
		Metadata:        true,
		Semaphore:       true,
		PermitFencing:   true,
		RWLock:          true,
		Records:         true, // record.go
		DurableRecords:  true,
	}
}

// keys are a lock's queue prefix and one lease's key under it.
type keys struct {
	prefix string // P N/
	key    string // P N/<token>
}

func (d *driver) keys(name, token string) keys {
	p := d.prefix + escape(name) + "/"
	return keys{prefix: p, key: p + token}
}

// TryAcquire is one transaction: put the key if there is no key at all under
// the name.
func (d *driver) TryAcquire(ctx context.Context, req dlockdriver.Request) (*dlockdriver.Grant, error) {
	if req.Kind != dlockdriver.KindLock {
		return d.tryKind(ctx, req)
	}
	k := d.keys(req.Name, req.Token)
	for retried := false; ; retried = true {
		l, err := d.lockLease(ctx, seconds(req.TTL))
		if err != nil {
			return nil, fmt.Errorf("etcd: granting a lease for %q: %w", k.prefix, err)
		}
		h := &handle{d: d, key: k.key, value: req.Metadata, l: l}
		if l.shared {
			if err := d.register(ctx, h); err != nil {
				return nil, fmt.Errorf("etcd: acquiring %q: following the changes: %w", k.prefix, err)
			}
		}
		resp, err := d.groupedTxn(ctx, k.prefix,
			clientv3.Compare(clientv3.CreateRevision(k.prefix), "=", 0).WithPrefix(),
			[]clientv3.Op{clientv3.OpPut(k.key, req.Metadata, clientv3.WithLease(l.id))}, nil)
		if err != nil {
			if l.shared {
				d.abandon(ctx, h)
				if leaseGone(err) {
					d.dropShared(l)
				}
			}
			if leaseGone(err) && !retried {
				continue // an idle lease was revoked behind our back
			}
			if l.shared {
				return nil, fmt.Errorf("etcd: acquiring %q: %w", k.prefix, err)
			}
			d.mu.Lock()
			d.attempts[req.Token] = l
			d.mu.Unlock()
			return nil, fmt.Errorf("etcd: acquiring %q: %w", k.prefix, err)
		}
		if !resp.Succeeded {
			d.unregister(h)
			d.putLease(l)
			return nil, dlockdriver.Busy(0)
		}
		return d.grant(h, resp.Header.Revision), nil
	}
}

// grant grants h, whose key was put at revision rev.
func (d *driver) grant(h *handle, rev int64) *dlockdriver.Grant {
	if h.l.shared {
		d.settle(h, rev, false)
	} else {
		h.rev = rev
	}
	return &dlockdriver.Grant{
		Handle: h,
		Fence:  uint64(rev),
		TTL:    h.l.granted,
		Sent:   h.l.lastSent(),
	}
}

// Abandon revokes the etcd lease of an attempt that may have created its key
// (which goes with it), or deletes the key when the attempt did not get as
// far as a lease.
func (d *driver) Abandon(ctx context.Context, req dlockdriver.Request) error {
	d.mu.Lock()
	l := d.attempts[req.Token]
	delete(d.attempts, req.Token)
	d.mu.Unlock()
	k := d.kindKeys(req)
	if l != nil {
		if _, err := d.c.Revoke(ctx, l.id); err != nil && !leaseGone(err) {
			return fmt.Errorf("etcd: abandoning an attempt on %q: %w", k.prefix, err)
		}
		return nil
	}
	if _, err := d.c.Delete(ctx, k.key); err != nil {
		return fmt.Errorf("etcd: abandoning an attempt on %q: %w", k.prefix, err)
	}
	return nil
}

func (d *driver) Close() error {
	d.drainPool()
	d.bg.Wait() // bounded by revokeTimeout
	if d.ownsClient && d.c != nil {
		if err := d.c.Close(); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("etcd: closing the client: %w", err)
		}
	}
	return nil
}

// newID returns 16 random bytes in hex.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
