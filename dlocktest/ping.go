package dlocktest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// The health checks speak each protocol's smallest exchange on a connection
// of their own, so that this package needs no backend's client library.

// ping runs kind's health check against addr once, bounded by ctx.
func ping(ctx context.Context, kind Kind, addr string) error {
	sp, err := spec(kind)
	if err != nil {
		return err
	}
	return sp.ping(ctx, addr)
}

// pingZooKeeperRW asks ruok, then isro: the server must serve, and not
// read-only (a member that lost its quorum answers ruok alone).
func pingZooKeeperRW(ctx context.Context, addr string) error {
	if err := pingZooKeeper(ctx, addr, "ruok", "imok"); err != nil {
		return err
	}
	return pingZooKeeper(ctx, addr, "isro", "rw")
}

// dial connects to addr with ctx's deadline applied to the connection.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return conn, nil
}

func pingRedis(ctx context.Context, addr string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "PING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("redis PING: %w", err)
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("redis PING: got %q, want +PONG", line)
	}
	return nil
}

func pingZooKeeper(ctx context.Context, addr, cmd, want string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, cmd); err != nil {
		return err
	}
	got, err := io.ReadAll(io.LimitReader(conn, 256))
	if err != nil {
		return fmt.Errorf("zookeeper %s: %w", cmd, err)
	}
	if g := strings.TrimSpace(string(got)); g != want {
		return fmt.Errorf("zookeeper %s: got %q, want %q", cmd, g, want)
	}
	return nil
}

func pingEtcd(ctx context.Context, addr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return err
	}
	// A transport of its own, without keep-alive or proxy: nothing outlives the
	// call.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil {
		return fmt.Errorf("etcd /health: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"health":"true"`)) {
		return fmt.Errorf("etcd /health: %s %s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// pingPostgres sends a protocol 3.0 startup message and reads the first reply,
// as pg_isready does: an authentication request, or any error other than
// 57P03 (cannot_connect_now: starting up, shutting down, recovering), means
// the server accepts connections. It never sends a password.
func pingPostgres(ctx context.Context, addr string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	params := "user\x00" + PostgresUser + "\x00database\x00" + PostgresDatabase + "\x00\x00"
	msg := binary.BigEndian.AppendUint32(nil, uint32(8+len(params)))
	msg = binary.BigEndian.AppendUint32(msg, 3<<16)
	msg = append(msg, params...)
	if _, err := conn.Write(msg); err != nil {
		return err
	}
	var hdr [5]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return fmt.Errorf("postgres startup: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 64<<10 {
		return fmt.Errorf("postgres startup: bad message length %d", n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(conn, body); err != nil {
		return fmt.Errorf("postgres startup: %w", err)
	}
	switch hdr[0] {
	case 'R':
		return nil
	case 'E':
		var code, text string
		for f := range bytes.SplitSeq(body, []byte{0}) {
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case 'C':
				code = string(f[1:])
			case 'M':
				text = string(f[1:])
			}
		}
		if code == "57P03" {
			return fmt.Errorf("postgres: %s (%s)", text, code)
		}
		return nil
	default:
		return fmt.Errorf("postgres startup: unexpected message %q", hdr[0])
	}
}

// pingMariaDB reads the server's greeting, as mysqladmin ping's connection
// does before it authenticates: a handshake packet (protocol version 10)
// means the server accepts connections; an error packet (0xff: too many
// connections, host blocked, shutting down) that it does not. Nothing is
// sent.
func pingMariaDB(ctx context.Context, addr string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	var hdr [4]byte // 3-byte little-endian length, sequence number
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return fmt.Errorf("mariadb greeting: %w", err)
	}
	n := int(hdr[0]) | int(hdr[1])<<8 | int(hdr[2])<<16
	if n < 1 || n > 64<<10 {
		return fmt.Errorf("mariadb greeting: bad packet length %d", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(conn, body); err != nil {
		return fmt.Errorf("mariadb greeting: %w", err)
	}
	switch body[0] {
	case 10:
		return nil
	case 0xff:
		msg := body[1:]
		if len(msg) > 2 {
			msg = msg[2:] // the error code
		}
		return fmt.Errorf("mariadb: %s", bytes.ToValidUTF8(msg, nil))
	default:
		return fmt.Errorf("mariadb greeting: unexpected protocol version %d", body[0])
	}
}
