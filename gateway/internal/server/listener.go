package server

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/gateway/internal/metrics"
)

// Accept back-off bounds: after a failed accept (EMFILE, ENFILE, ENOBUFS, ...) the listener waits
// acceptBackoffMin, doubling up to acceptBackoffMax, and tries again.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// limitListener wraps the client listener: it never gives up on an accept error (fasthttp treats every
// non-timeout error as permanent and returns from Serve, which left a live process with a dead port), and
// closes at once a connection over max_connections or max_connections_per_ip.
type limitListener struct {
	net.Listener
	maxConns, maxPerIP int
	trusted            []netip.Prefix
	m                  *metrics.FrontDoor
	log                *slog.Logger

	open    atomic.Int64
	mu      sync.Mutex
	perIP   map[netip.Addr]int
	lastLog time.Time
}

func newLimitListener(ln net.Listener, maxConns, maxPerIP int, trusted []netip.Prefix, m *metrics.FrontDoor, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, maxConns: maxConns, maxPerIP: maxPerIP, trusted: trusted, m: m, log: log,
		perIP: map[netip.Addr]int{}}
}

// Accept returns the next connection within the limits. It returns an error only once the listener is
// closed (net.ErrClosed): every other accept error is logged (at most once a second), counted in
// kvgate_accept_errors_total, and retried after a back-off.
func (l *limitListener) Accept() (net.Conn, error) {
	backoff := acceptBackoffMin
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			l.m.AcceptErrors.Inc()
			now := time.Now()
			l.mu.Lock()
			logIt := now.Sub(l.lastLog) >= time.Second
			if logIt {
				l.lastLog = now
			}
			l.mu.Unlock()
			if logIt {
				l.log.Error("accept failed; backing off and accepting again", slog.String("error", err.Error()),
					slog.Float64("backoff_seconds", backoff.Seconds()), slog.Bool("fd_limit", errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)))
			}
			time.Sleep(backoff)
			backoff = min(backoff*2, acceptBackoffMax)
			continue
		}
		backoff = acceptBackoffMin
		if n := l.open.Add(1); n > int64(l.maxConns) {
			l.open.Add(-1)
			c.Close()
			l.m.ConnectionsRejected.WithLabelValues(metrics.RejectMaxConnections).Inc()
			continue
		}
		ip := peerAddr(c.RemoteAddr())
		counted := false
		if l.maxPerIP > 0 && ip.IsValid() && !trustedPeer(l.trusted, ip) {
			l.mu.Lock()
			if l.perIP[ip] >= l.maxPerIP {
				l.mu.Unlock()
				l.open.Add(-1)
				c.Close()
				l.m.ConnectionsRejected.WithLabelValues(metrics.RejectMaxConnectionsPerIP).Inc()
				continue
			}
			l.perIP[ip]++
			l.mu.Unlock()
			counted = true
		}
		l.m.ConnectionsOpen.Inc()
		lc := &limitConn{Conn: c, l: l, ip: ip, perIP: counted}
		if sc, ok := c.(syscall.Conn); ok {
			return &limitSysConn{limitConn: lc, sc: sc}, nil
		}
		return lc, nil
	}
}

func (l *limitListener) release(ip netip.Addr, perIP bool) {
	l.open.Add(-1)
	l.m.ConnectionsOpen.Dec()
	if perIP {
		l.mu.Lock()
		if l.perIP[ip]--; l.perIP[ip] <= 0 {
			delete(l.perIP, ip)
		}
		l.mu.Unlock()
	}
}

// limitConn gives its slot back on the first Close.
type limitConn struct {
	net.Conn
	l     *limitListener
	ip    netip.Addr
	perIP bool
	once  sync.Once
}

// Close closes the connection and frees its slot (once).
func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip, c.perIP) })
	return err
}

// limitSysConn keeps the raw socket reachable (syscall.Conn) for the disconnect watcher's MSG_PEEK poll.
type limitSysConn struct {
	*limitConn
	sc syscall.Conn
}

// SyscallConn returns the underlying socket's raw connection.
func (c *limitSysConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }

// peerAddr returns a connection's remote IP (unmapped), or the zero Addr.
func peerAddr(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return ip.Unmap()
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

func trustedPeer(trusted []netip.Prefix, ip netip.Addr) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
