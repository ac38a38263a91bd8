package zookeeper

import (
	"context"
	"net/url"
	"strconv"
	"strings"

	"github.com/dlock/dlock"
	dlockdriver "github.com/dlock/dlock/driver"
	"github.com/go-zookeeper/zk"
)

func init() {
	dlockdriver.Register("zk", open)
}

// open is the dlockdriver.OpenFunc for zk:// URLs.
// It connects at once: the shortest TTL the Locker accepts is the server's
// minimum session timeout, which only a session can tell.
func open(ctx context.Context, u *url.URL) (dlockdriver.Driver, error) {
	servers, opts, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	d, _, err := connect(ctx, servers, opts) // its errors name the servers, never the credentials
	if err != nil {
		return nil, err
	}
	return d, nil
}

// paramACL is the URL parameter for Options.ACL.
const paramACL = "acl"

// ParseURL turns a zk:// URL into the servers and Options for Connect,
// without network I/O.
// Every error matches dlock.ErrInvalid and leaves the password, and ACL
// entries (which may hold digests of passwords), out.
func ParseURL(u *url.URL) ([]string, *Options, error) {
	if u.Scheme != "zk" {
		return nil, nil, invalid("scheme %q is not zk", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, nil, invalid("URL must look like zk://host:2181[,host:2181…][/root]")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, dlockdriver.QueryError("zookeeper", err)
	}
	lock, err := dlock.OptionsFromQuery(q)
	if err != nil {
		return nil, nil, err
	}
	opts := &Options{Defaults: *lock}
	p := dlockdriver.Params{Q: q, Driver: "zookeeper"}
	acl, hasACL := p.Take(paramACL)
	servers := p.Hosts(u.Host, strconv.Itoa(zk.DefaultPort))
	if err := p.Done(); err != nil {
		return nil, nil, err
	}
	if hasACL {
		if opts.ACL, err = parseACL(acl); err != nil {
			return nil, nil, err
		}
	}

	if p := strings.TrimSuffix(u.Path, "/"); p != "" {
		opts.Root = p
		if err := checkRoot(p); err != nil {
			return nil, nil, err
		}
	}

	if u.User != nil {
		pw, ok := u.User.Password()
		if !ok || u.User.Username() == "" {
			return nil, nil, invalid("digest credentials must be user:password")
		}
		opts.Auth = []Auth{{Scheme: "digest", Secret: []byte(u.User.Username() + ":" + pw)}}
	}
	return servers, opts, nil
}

// parseACL reads an acl parameter: open, creator, read, or a list of
// scheme:id:perms entries (zkCli's notation; perms from cdrwa).
func parseACL(s string) ([]zk.ACL, error) {
	switch s {
	case "open":
		return zk.WorldACL(zk.PermAll), nil
	case "creator":
		return zk.AuthACL(zk.PermAll), nil
	case "read":
		return append(zk.AuthACL(zk.PermAll), zk.WorldACL(zk.PermRead)...), nil
	}
	var acl []zk.ACL
	for i, entry := range strings.Split(s, ",") {
		scheme, rest, ok1 := strings.Cut(entry, ":")
		i2 := strings.LastIndex(rest, ":")
		if !ok1 || i2 < 0 || scheme == "" {
			return nil, invalid("acl entry %d is not scheme:id:perms (or open, creator, read)", i+1)
		}
		id, perms := rest[:i2], rest[i2+1:]
		var p int32
		for _, c := range perms {
			bit, ok := map[rune]int32{'c': zk.PermCreate, 'd': zk.PermDelete, 'r': zk.PermRead, 'w': zk.PermWrite, 'a': zk.PermAdmin}[c]
			if !ok {
				return nil, invalid("acl entry %d: permissions are letters of cdrwa", i+1)
			}
			p |= bit
		}
		if p == 0 {
			return nil, invalid("acl entry %d grants nothing", i+1)
		}
		acl = append(acl, zk.ACL{Perms: p, Scheme: scheme, ID: id})
	}
	return acl, nil
}
