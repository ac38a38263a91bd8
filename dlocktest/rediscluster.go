package dlocktest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RedisCluster is a Redis Cluster of masters without replicas, each a Redis
// server of this package in cluster mode, all slots assigned. The nodes talk
// to each other over their container addresses; to clients they announce
// 127.0.0.1 and their published port (cluster-announce-hostname with
// cluster-preferred-endpoint-type hostname, cluster-announce-port), so that
// CLUSTER SLOTS and MOVED redirects name addresses a client on this host can
// dial.
type RedisCluster struct {
	// Nodes are the masters; node i serves the i-th of equal slot ranges.
	Nodes []*Server
}

// Addrs are the nodes' client addresses, to seed a cluster client.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Close removes every node.
func (c *RedisCluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}

// StartRedisCluster starts a Redis Cluster of the given number of masters
// (at least 3) and returns once every node reports the cluster ok and knows
// every other node's announced address. ctx bounds all of it. It needs
// containers: with DLOCK_REDIS_ADDR set it fails with ErrNotControllable.
func StartRedisCluster(ctx context.Context, masters int) (*RedisCluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("dlocktest: a Redis Cluster needs at least 3 masters, not %d", masters)
	}
	opts := &StartOptions{Cmd: []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "/tmp/nodes.conf",
		"--cluster-node-timeout", "5000",
		"--cluster-announce-hostname", "127.0.0.1",
		"--cluster-preferred-endpoint-type", "hostname",
		"--cluster-announce-bus-port", "16379",
	}}
	nodes, err := startMany(ctx, masters, opts)
	c := &RedisCluster{Nodes: nodes}
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if err := c.form(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("dlocktest: forming a Redis Cluster: %w", err), c.Close())
	}
	return c, nil
}

// startMany starts n Redis servers at once.
func startMany(ctx context.Context, n int, opts *StartOptions) ([]*Server, error) {
	nodes := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = Start(ctx, Redis, opts)
		}()
	}
	wg.Wait()
	started := nodes[:0]
	for _, s := range nodes {
		if s != nil {
			started = append(started, s)
		}
	}
	return started, errors.Join(errs...)
}

// form announces the published ports, assigns the slots, introduces the
// nodes to the first and waits for the cluster to agree.
func (c *RedisCluster) form(ctx context.Context) error {
	const slots = 16384
	n := len(c.Nodes)
	ips := make([]string, n)
	for i, s := range c.Nodes {
		_, port, _ := net.SplitHostPort(s.Addr())
		if _, err := redisCommand(ctx, s.Addr(), "CONFIG", "SET", "cluster-announce-port", port); err != nil {
			return err
		}
		ip, err := containerIP(ctx, s.Addr())
		if err != nil {
			return err
		}
		ips[i] = ip
		first, last := i*slots/n, (i+1)*slots/n-1
		if _, err := redisCommand(ctx, s.Addr(), "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(first), strconv.Itoa(last)); err != nil {
			return err
		}
	}
	for i := 1; i < n; i++ {
		if _, err := redisCommand(ctx, c.Nodes[0].Addr(), "CLUSTER", "MEET", ips[i], "6379", "16379"); err != nil {
			return err
		}
	}
	return poll(ctx, func() error {
		for _, s := range c.Nodes {
			if err := clusterAgrees(ctx, s.Addr(), c.Addrs()); err != nil {
				return err
			}
		}
		return nil
	})
}

// clusterAgrees checks that the node at addr reports the cluster ok and
// names every node by its 127.0.0.1 address.
func clusterAgrees(ctx context.Context, addr string, addrs []string) error {
	info, err := redisCommand(ctx, addr, "CLUSTER", "INFO")
	if err != nil {
		return err
	}
	if !strings.Contains(info.(string), "cluster_state:ok") {
		return fmt.Errorf("%s: cluster state not ok yet", addr)
	}
	nodes, err := redisCommand(ctx, addr, "CLUSTER", "NODES")
	if err != nil {
		return err
	}
	// Each line: <id> <ip:port@cport,hostname> <flags> ...
	seen := map[string]bool{}
	for line := range strings.Lines(nodes.(string)) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		ipPort, host, _ := strings.Cut(f[1], ",")
		_, port, _ := strings.Cut(ipPort, ":")
		port, _, _ = strings.Cut(port, "@")
		if f[7] == "connected" {
			seen[host+":"+port] = true
		}
	}
	for _, a := range addrs {
		if !seen[a] {
			return fmt.Errorf("%s does not know %s as a connected node yet", addr, a)
		}
	}
	return nil
}

// RedisSentinel is one Redis master, one replica of it, and one Redis
// Sentinel monitoring them under MasterName, each a Redis server of this
// package (the sentinel runs from the same image). The servers know each
// other by their container addresses, which Sentinel hands to clients:
// dial through Dial, which reaches them on their published ports.
type RedisSentinel struct {
	Master, Replica, Sentinel *Server

	published map[string]string // container address -> 127.0.0.1 address
}

// MasterName is the name the sentinel monitors the master under.
const MasterName = "dlock"

// StartRedisSentinel starts a master, its replica and a sentinel, and
// returns once the sentinel knows both (so that a failover can be asked
// for). ctx bounds all of it. It needs containers: with DLOCK_REDIS_ADDR set
// it fails with ErrNotControllable.
func StartRedisSentinel(ctx context.Context) (*RedisSentinel, error) {
	rs := &RedisSentinel{published: map[string]string{}}
	var err error
	if rs.Master, err = Start(ctx, Redis, nil); err != nil {
		return nil, err
	}
	if err := rs.setUp(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("dlocktest: setting up Redis Sentinel: %w", err), rs.Close())
	}
	return rs, nil
}

func (rs *RedisSentinel) setUp(ctx context.Context) error {
	masterIP, err := containerIP(ctx, rs.Master.Addr())
	if err != nil {
		return err
	}
	rs.published[net.JoinHostPort(masterIP, "6379")] = rs.Master.Addr()
	if rs.Replica, err = Start(ctx, Redis, &StartOptions{Cmd: []string{"--replicaof", masterIP, "6379"}}); err != nil {
		return err
	}
	replicaIP, err := containerIP(ctx, rs.Replica.Addr())
	if err != nil {
		return err
	}
	rs.published[net.JoinHostPort(replicaIP, "6379")] = rs.Replica.Addr()
	if rs.Sentinel, err = Start(ctx, Redis, &StartOptions{Cmd: []string{"sentinel"}}); err != nil {
		return err
	}
	s := rs.Sentinel.Addr()
	for _, cmd := range [][]string{
		{"SENTINEL", "MONITOR", MasterName, masterIP, "6379", "1"},
		// Tests fail over with SENTINEL FAILOVER, which needs no down
		// detection. A short down-after let a master stalled for a second
		// on a loaded machine be failed over in the middle of a test that
		// wanted none (the conformance run lost its key to the promoted
		// replica).
		{"SENTINEL", "SET", MasterName, "down-after-milliseconds", "60000"},
		{"SENTINEL", "SET", MasterName, "failover-timeout", "10000"},
	} {
		if _, err := redisCommand(ctx, s, cmd...); err != nil {
			return err
		}
	}
	return poll(ctx, func() error {
		r, err := redisCommand(ctx, s, "SENTINEL", "REPLICAS", MasterName)
		if err != nil {
			return err
		}
		if list, _ := r.([]any); len(list) == 0 {
			return errors.New("the sentinel does not know the replica yet")
		}
		info, err := redisCommand(ctx, rs.Replica.Addr(), "INFO", "replication")
		if err != nil {
			return err
		}
		if !strings.Contains(info.(string), "master_link_status:up") {
			return errors.New("the replica is not in sync yet")
		}
		return nil
	})
}

// Dial is a go-redis Dialer for the failover client's options: it reaches
// the master and the replica, which Sentinel names by their container
// addresses, on their published ports, and every other address as it is.
func (rs *RedisSentinel) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, rs.PublishedAddr(addr))
}

// PublishedAddr returns the address on this host of the server that
// Sentinel names addr: the published port of the master or the replica for
// their container addresses, any other address unchanged.
func (rs *RedisSentinel) PublishedAddr(addr string) string {
	if p, ok := rs.published[addr]; ok {
		return p
	}
	return addr
}

// Close removes the three servers.
func (rs *RedisSentinel) Close() error {
	var errs []error
	for _, s := range []*Server{rs.Sentinel, rs.Replica, rs.Master} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

var (
	sharedClusterMu sync.Mutex
	sharedCluster   *RedisCluster
)

// RequireRedisCluster returns the test binary's shared Redis Cluster of
// three masters, starting it on first use; CloseAll removes it. Tests must
// not pause, stop or close its nodes. It skips and fails as Require does,
// and also skips, as RequireNew does, when DLOCK_REDIS_ADDR names an
// external server, since no cluster can be made then.
func RequireRedisCluster(tb TB) *RedisCluster {
	tb.Helper()
	requireContainers(tb, "a Redis Cluster")
	sharedClusterMu.Lock()
	defer sharedClusterMu.Unlock()
	if sharedCluster != nil && !sharedCluster.closed() {
		return sharedCluster
	}
	ctx, cancel := context.WithTimeout(tb.Context(), requireTimeout)
	defer cancel()
	c, err := StartRedisCluster(ctx, 3)
	if err != nil {
		requireFailed(tb, "Redis Cluster", err)
	}
	sharedCluster = c
	return c
}

// RequireRedisSentinel starts a master, a replica and a sentinel for this
// test alone (see StartRedisSentinel), removed when the test ends. It skips
// and fails as RequireRedisCluster does.
func RequireRedisSentinel(tb TB) *RedisSentinel {
	tb.Helper()
	requireContainers(tb, "Redis Sentinel")
	ctx, cancel := context.WithTimeout(tb.Context(), requireTimeout)
	defer cancel()
	rs, err := StartRedisSentinel(ctx)
	if err != nil {
		requireFailed(tb, "Redis Sentinel", err)
	}
	tb.Cleanup(func() {
		if err := rs.Close(); err != nil {
			tb.Error(err)
		}
	})
	return rs
}

func (c *RedisCluster) closed() bool {
	for _, n := range c.Nodes {
		n.mu.Lock()
		closed := n.closed
		n.mu.Unlock()
		if closed {
			return true
		}
	}
	return false
}

// requireContainers skips a test that needs containers while
// DLOCK_REDIS_ADDR names an external server, as RequireNew does.
func requireContainers(tb TB, what string) {
	tb.Helper()
	if os.Getenv(envVar(Redis)) == "" {
		return
	}
	tb.Skipf("dlocktest: %s needs containers, but %s names an external server", what, envVar(Redis))
}

// containerIP returns the address of the Redis server at addr inside its
// Docker network: the local address of the connection it sees (CLIENT
// INFO's laddr), which Docker forwards from the published port. The other
// containers reach it there.
func containerIP(ctx context.Context, addr string) (string, error) {
	r, err := redisCommand(ctx, addr, "CLIENT", "INFO")
	if err != nil {
		return "", err
	}
	for f := range strings.FieldsSeq(r.(string)) {
		if v, ok := strings.CutPrefix(f, "laddr="); ok {
			host, _, err := net.SplitHostPort(v)
			if err != nil {
				return "", fmt.Errorf("%s: CLIENT INFO laddr %q: %w", addr, v, err)
			}
			return host, nil
		}
	}
	return "", fmt.Errorf("%s: CLIENT INFO has no laddr", addr)
}

// redisCommand sends one command on a connection of its own and returns
// the reply: a string (simple or bulk), an int64, nil or a []any; an error
// reply is an error. ctx bounds it, 5s at most.
func redisCommand(ctx context.Context, addr string, args ...string) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	r, err := readReply(bufio.NewReader(conn))
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", addr, strings.Join(args[:min(2, len(args))], " "), err)
	}
	return r, nil
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply")
	}
	switch body := line[1:]; line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, errors.New(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		list := make([]any, n)
		for i := range list {
			if list[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return list, nil
	default:
		return nil, fmt.Errorf("unexpected reply %q", line)
	}
}
