package dlock

import (
	"fmt"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/dlock/dlock/driver"
)

// Defaults for Options fields left zero.
const (
	DefaultTTL      = 15 * time.Second
	DefaultRetryMin = 10 * time.Millisecond
	DefaultRetryMax = time.Second
	// MaxNameLen is the longest lock name, in bytes, that every driver accepts.
	MaxNameLen = 512
	// MaxMetadataLen bounds Options.Metadata, in bytes.
	MaxMetadataLen = 1024
)

// Options control one acquisition. A nil *Options, and every zero field, means
// the Locker's defaults (set by its URL or constructor), then the package
// defaults documented on each field. Each field maps to the URL query
// parameter named in its comment.
type Options struct {
	// TTL is how long the lock lives on the server unless refreshed
	// (URL: ttl=10s). Default 15s: zero means the default, a negative TTL or
	// one below Capabilities.MinTTL is ErrInvalid. In a URL the value must be
	// positive (ttl=0s is rejected; leave the parameter out for the default).
	TTL time.Duration

	// NoRefresh turns the watchdog off (URL: refresh=false). By default a
	// lease is refreshed every RefreshInterval; a refresh that fails is retried
	// until ValidUntil, and then the lease reports loss.
	NoRefresh bool

	// RefreshInterval is the watchdog's period (URL: refresh_interval=5s).
	// Default TTL/3.
	RefreshInterval time.Duration

	// RetryMin and RetryMax bound a delay that starts at RetryMin, doubles
	// after every failure up to RetryMax, and is stretched by up to a quarter
	// at random (URL: retry_min=10ms, retry_max=1s; defaults 10ms and 1s). It
	// is the delay between a lease's refresh attempts after a failed refresh,
	// and between the attempts of an Acquire on a driver that polls (redis
	// compat layout, redlock, memory), shortened to the holder's remaining
	// TTL when the driver reports it. Where the backend announces releases
	// (NotifiedWait), an Acquire waits for the announcement and polls only
	// when the holder's lock would expire, or after RetryMax when that is
	// unknown. Drivers whose servers queue waiters (etcd, zookeeper,
	// postgres, redis) do not use them for waiting.
	RetryMin, RetryMax time.Duration

	// Metadata is stored with the lock where the backend can, for
	// introspection (URL: metadata=host-a). Default empty.
	Metadata string

	// MaxHold bounds how long the watchdog keeps the lease (URL:
	// max_hold=1h): it sends no refresh once MaxHold has passed since the
	// grant's request was sent, and the lease ends at its ValidUntil, at
	// most MaxHold + TTL after the grant, with an error matching ErrLost
	// and ErrMaxHold. A manual Refresh past MaxHold is refused with
	// ErrMaxHold. Default zero: no bound. It must not be below the TTL
	// (ErrInvalid): the first grant alone would outlive it.
	MaxHold time.Duration

	// HeartbeatTimeout ties the lease to the work that holds it (URL:
	// heartbeat_timeout=30s): the watchdog refreshes only while
	// Lease.Heartbeat was called (or the lease granted) within the last
	// HeartbeatTimeout. When the work stops calling it, the watchdog stops
	// for good, and the lease ends at its ValidUntil, at most
	// HeartbeatTimeout + TTL after the last heartbeat, with an error
	// matching ErrLost and ErrHeartbeatTimeout. Default zero: no
	// heartbeat needed. It needs the watchdog: with NoRefresh it is
	// ErrInvalid.
	HeartbeatTimeout time.Duration
}

// minTTL is the shortest TTL any Locker accepts: a grant's validity is its
// TTL less the drift margin (TTL/100 + 2ms), which must leave a few
// milliseconds.
const minTTL = 5 * time.Millisecond

// resolve merges o over defaults over the package defaults and validates the
// result against the driver's capabilities.
func (o *Options) resolve(defaults *Options, caps Capabilities) (Options, error) {
	var r Options
	for _, src := range []*Options{defaults, o} {
		if src == nil {
			continue
		}
		if src.TTL != 0 {
			r.TTL = src.TTL
		}
		if src.NoRefresh {
			r.NoRefresh = true
		}
		if src.RefreshInterval != 0 {
			r.RefreshInterval = src.RefreshInterval
		}
		if src.RetryMin != 0 {
			r.RetryMin = src.RetryMin
		}
		if src.RetryMax != 0 {
			r.RetryMax = src.RetryMax
		}
		if src.Metadata != "" {
			r.Metadata = src.Metadata
		}
		if src.MaxHold != 0 {
			r.MaxHold = src.MaxHold
		}
		if src.HeartbeatTimeout != 0 {
			r.HeartbeatTimeout = src.HeartbeatTimeout
		}
	}
	if o != nil && o.TTL < 0 {
		return r, invalid("TTL %v is not positive", o.TTL)
	}
	if r.TTL == 0 {
		r.TTL = DefaultTTL
	}
	if r.RetryMin == 0 {
		r.RetryMin = DefaultRetryMin
	}
	if r.RetryMax == 0 {
		r.RetryMax = DefaultRetryMax
	}
	if r.RefreshInterval == 0 {
		r.RefreshInterval = r.TTL / 3
	}
	if err := r.validate(caps); err != nil {
		return r, err
	}
	return r, r.validateWork()
}

// validateWork checks the bounds that tie a lease to its work, MaxHold and
// HeartbeatTimeout, which only the watchdog applies (Refresh validates
// without them).
func (o *Options) validateWork() error {
	switch {
	case o.MaxHold < 0:
		return invalid("max hold %v is negative", o.MaxHold)
	case o.MaxHold > 0 && o.MaxHold < o.TTL:
		return invalid("max hold %v is below the TTL %v: the first grant alone would outlive it", o.MaxHold, o.TTL)
	case o.HeartbeatTimeout < 0:
		return invalid("heartbeat timeout %v is negative", o.HeartbeatTimeout)
	case o.HeartbeatTimeout > 0 && o.NoRefresh:
		return invalid("heartbeat timeout %v needs the watchdog, which NoRefresh turns off", o.HeartbeatTimeout)
	}
	return nil
}

func (o *Options) validate(caps Capabilities) error {
	switch {
	case o.TTL <= 0:
		return invalid("TTL %v is not positive", o.TTL)
	case o.TTL < caps.MinTTL:
		return invalid("TTL %v is below the backend's minimum %v", o.TTL, caps.MinTTL)
	case o.TTL < minTTL:
		// Below it the drift margin (TTL/100 + 2ms) leaves no validity: no
		// grant could ever be valid, whatever the driver declares.
		return invalid("TTL %v is below %v, the shortest whose validity outlasts the clock drift margin", o.TTL, minTTL)
	case o.RefreshInterval < 0 || o.RefreshInterval >= o.TTL:
		return invalid("refresh interval %v must be positive and below the TTL %v", o.RefreshInterval, o.TTL)
	case o.RetryMin < 0 || o.RetryMax < o.RetryMin:
		return invalid("retry delays %v..%v are not an ascending positive range", o.RetryMin, o.RetryMax)
	case len(o.Metadata) > MaxMetadataLen:
		return invalid("metadata is %d bytes, over the limit of %d", len(o.Metadata), MaxMetadataLen)
	case !utf8.ValidString(o.Metadata):
		return invalid("metadata is not valid UTF-8")
	}
	return nil
}

// ValidateName reports whether name is accepted by every driver: non-empty,
// valid UTF-8, no NUL byte, at most MaxNameLen bytes. Drivers map accepted
// names onto their backend (escaping, hashing) themselves.
func ValidateName(name string) error {
	switch {
	case name == "":
		return invalid("empty lock name")
	case len(name) > MaxNameLen:
		return invalid("lock name is %d bytes, over the limit of %d", len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return invalid("lock name is not valid UTF-8")
	}
	for i := 0; i < len(name); i++ {
		if name[i] == 0 {
			return invalid("lock name contains a NUL byte")
		}
	}
	return nil
}

// OptionsFromQuery takes the lock options (ttl, refresh, refresh_interval,
// retry_min, retry_max, metadata, max_hold, heartbeat_timeout) out of a URL query, deleting the keys it
// used from q. Open does this before the driver reads its own parameters;
// drivers' ParseURL functions do it for their Options.Defaults.
func OptionsFromQuery(q url.Values) (*Options, error) {
	p := driver.Params{Q: q}
	o := &Options{}
	o.TTL, _ = p.TakeDuration("ttl")
	if refresh, ok := p.TakeBool("refresh"); ok {
		o.NoRefresh = !refresh
	}
	o.RefreshInterval, _ = p.TakeDuration("refresh_interval")
	o.RetryMin, _ = p.TakeDuration("retry_min")
	o.RetryMax, _ = p.TakeDuration("retry_max")
	o.Metadata, _ = p.Take("metadata")
	o.MaxHold, _ = p.TakeDuration("max_hold")
	o.HeartbeatTimeout, _ = p.TakeDuration("heartbeat_timeout")
	if p.Err != nil {
		return nil, p.Err
	}
	return o, nil
}

// Query returns the URL query parameters that express o, the inverse of
// OptionsFromQuery (zero fields are left out).
func (o *Options) Query() url.Values {
	q := url.Values{}
	if o == nil {
		return q
	}
	set := func(k string, d time.Duration) {
		if d != 0 {
			q.Set(k, d.String())
		}
	}
	set("ttl", o.TTL)
	set("refresh_interval", o.RefreshInterval)
	set("retry_min", o.RetryMin)
	set("retry_max", o.RetryMax)
	set("max_hold", o.MaxHold)
	set("heartbeat_timeout", o.HeartbeatTimeout)
	if o.NoRefresh {
		q.Set("refresh", "false")
	}
	if o.Metadata != "" {
		q.Set("metadata", o.Metadata)
	}
	return q
}

func (o Options) String() string {
	s := fmt.Sprintf("ttl=%v refresh=%v/%v retry=%v..%v", o.TTL, !o.NoRefresh, o.RefreshInterval, o.RetryMin, o.RetryMax)
	if o.MaxHold > 0 {
		s += fmt.Sprintf(" max_hold=%v", o.MaxHold)
	}
	if o.HeartbeatTimeout > 0 {
		s += fmt.Sprintf(" heartbeat_timeout=%v", o.HeartbeatTimeout)
	}
	return s
}
