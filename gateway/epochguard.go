package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// errEpochChanged is the dial error of a connection to a Redis that no longer holds the store epoch the
// router's leases were taken in (it restarted empty, or the marker was removed).
var errEpochChanged = errors.New("gateway: redis store epoch changed (restarted without its data)")

// epochGuard is a go-redis hook for a standalone Redis: before the client uses a new connection, it reads the
// epoch marker on it and refuses the connection when the marker is not the epoch the router expects. A Redis
// that restarts empty can only be reached through new connections, and go-redis retries a failed command on a
// new one without telling its caller; without the guard, reservations in the moments before the router's
// periodic epoch check would see an empty store. The refused dial fails the command, the router switches to
// store-down routing, stops expecting an epoch, and recovers (re-registering its running requests).
type epochGuard struct {
	username string // AUTH user (ACL), with password
	password string // AUTH before reading, when set
	db       int    // SELECT before reading, when not 0
	timeout  time.Duration
	// expect returns the epoch to require, and false while nothing is required (router not started, or
	// its store is down or recovering).
	expect func() (string, bool)
}

var _ redis.Hook = epochGuard{}

// DialHook checks each new connection's epoch marker.
func (g epochGuard) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		want, enforce := g.expect()
		if !enforce {
			return conn, nil
		}
		got, err := g.readMarker(ctx, conn)
		if err == nil && got != want {
			err = fmt.Errorf("%w: marker %q, expected %q", errEpochChanged, got, want)
		}
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
		return conn, nil
	}
}

// ProcessHook passes commands through.
func (epochGuard) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook passes pipelines through.
func (epochGuard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// readMarker reads the epoch marker on a fresh connection in RESP2 (before go-redis's own handshake), leaving
// nothing unread: the server answers exactly the commands sent. It gives up after g.timeout or at ctx's
// deadline, whichever is first (a hung server must not hold a request past its store timeout).
func (g epochGuard) readMarker(ctx context.Context, conn net.Conn) (string, error) {
	dl := time.Now().Add(g.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = conn.SetDeadline(dl)
	defer conn.SetDeadline(time.Time{})
	var cmds []string
	switch {
	case g.password != "" && g.username != "":
		cmds = append(cmds, respCommand("AUTH", g.username, g.password))
	case g.password != "":
		cmds = append(cmds, respCommand("AUTH", g.password))
	}
	if g.db != 0 {
		cmds = append(cmds, respCommand("SELECT", strconv.Itoa(g.db)))
	}
	cmds = append(cmds, respCommand("GET", storeEpochKey))
	if _, err := io.WriteString(conn, strings.Join(cmds, "")); err != nil {
		return "", fmt.Errorf("gateway: epoch check: %w", err)
	}
	// One reply per command; bufio reads only what has arrived, and nothing else is sent by the server.
	br := bufio.NewReaderSize(conn, 256)
	for range len(cmds) - 1 {
		line, err := readLine(br)
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(line, "+") {
			return "", fmt.Errorf("gateway: epoch check: %s", line)
		}
	}
	line, err := readLine(br)
	if err != nil {
		return "", err
	}
	if line == "$-1" {
		return "", nil
	}
	if !strings.HasPrefix(line, "$") {
		return "", fmt.Errorf("gateway: epoch check: %s", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 || n > 1024 {
		return "", fmt.Errorf("gateway: epoch check: bulk length %q", line)
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(br, buf); err != nil {
		return "", fmt.Errorf("gateway: epoch check: %w", err)
	}
	if br.Buffered() != 0 {
		return "", errors.New("gateway: epoch check: unexpected bytes after the reply")
	}
	return string(buf[:n]), nil
}

func respCommand(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

func readLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("gateway: epoch check: %w", err)
	}
	return strings.TrimSuffix(line, "\r\n"), nil
}
