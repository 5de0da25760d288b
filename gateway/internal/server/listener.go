package server

import (
	"crypto/tls"
	"errors"
	"io"
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

// lingerLimits bound a lingering close: how long (client_lingering_time) and how many bytes
// (client_lingering_bytes) it discards, and how many connections linger at once
// (max_lingering_connections).
type lingerLimits struct {
	time  time.Duration
	bytes int64
	max   int
}

// limitListener wraps the client listener: it never gives up on an accept error (fasthttp treats every
// non-timeout error as permanent and returns from Serve, which left a live process with a dead port),
// closes at once a connection over max_connections or max_connections_per_ip, and gives a connection
// marked by lingerOnClose a lingering close (gateway/RATIONALE.md).
type limitListener struct {
	net.Listener
	maxConns, maxPerIP int
	trusted            []netip.Prefix
	linger             lingerLimits
	m                  *metrics.FrontDoor
	log                *slog.Logger

	open    atomic.Int64
	mu      sync.Mutex
	perIP   map[netip.Addr]int
	lastLog time.Time

	// lingering are the connections in a lingering close; closed is set by Close, after which none
	// starts. wg counts the lingering goroutines.
	lingerMu  sync.Mutex
	lingering map[*limitConn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

func newLimitListener(ln net.Listener, maxConns, maxPerIP int, trusted []netip.Prefix, linger lingerLimits, m *metrics.FrontDoor, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, maxConns: maxConns, maxPerIP: maxPerIP, trusted: trusted, linger: linger, m: m, log: log,
		perIP: map[netip.Addr]int{}, lingering: map[*limitConn]struct{}{}}
}

// Close closes the listener and ends the lingering closes at once (their connections are closed), waiting
// for them.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.lingerMu.Lock()
	l.closed = true
	for c := range l.lingering {
		c.shutdown.Store(true)
		c.Conn.SetReadDeadline(time.Unix(1, 0)) // the pending Read returns at once
	}
	l.lingerMu.Unlock()
	l.wg.Wait()
	return err
}

// startLinger registers c as lingering and sets its read deadline, or says no with the result to count:
// the listener is closed (shutdown), max_lingering_connections are lingering (skipped), the deadline
// cannot be set (error).
func (l *limitListener) startLinger(c *limitConn) (ok bool, result string) {
	l.lingerMu.Lock()
	defer l.lingerMu.Unlock()
	switch {
	case l.closed:
		return false, metrics.LingerShutdown
	case len(l.lingering) >= l.linger.max:
		return false, metrics.LingerSkipped
	case c.Conn.SetReadDeadline(time.Now().Add(l.linger.time)) != nil:
		return false, metrics.LingerError
	}
	l.lingering[c] = struct{}{}
	l.wg.Add(1)
	l.m.ConnectionsLingering.Inc()
	return true, ""
}

func (l *limitListener) endLinger(c *limitConn, result string) {
	l.lingerMu.Lock()
	delete(l.lingering, c)
	l.lingerMu.Unlock()
	l.m.ConnectionsLingering.Dec()
	l.m.LingeringCloses.WithLabelValues(result).Inc()
	l.wg.Done()
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

// limitConn gives its slot back on the first Close, or at the end of its lingering close.
type limitConn struct {
	net.Conn
	l     *limitListener
	ip    netip.Addr
	perIP bool
	once  sync.Once
	// linger is set by lingerOnClose; shutdown by the listener's Close while lingering.
	linger, shutdown atomic.Bool
}

// lingerOnClose asks the next Close for a lingering close.
func (c *limitConn) lingerOnClose() { c.linger.Store(true) }

// Close closes the connection and frees its slot (once). After lingerOnClose it instead half-closes the
// connection (the client reads the answer and then end of stream) and returns; a goroutine reads and
// discards what the client still sends until the client closes, client_lingering_time passes or
// client_lingering_bytes were read, and then closes it. Over max_lingering_connections, or when the
// half-close fails, it closes at once.
func (c *limitConn) Close() error {
	if c.linger.Swap(false) {
		if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
			if ok, result := c.l.startLinger(c); !ok {
				c.l.m.LingeringCloses.WithLabelValues(result).Inc()
			} else if cw.CloseWrite() != nil {
				c.l.endLinger(c, metrics.LingerError)
			} else {
				go c.drain()
				return nil
			}
		}
	}
	return c.close()
}

func (c *limitConn) close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip, c.perIP) })
	return err
}

// lingerBufSize is the read size of a lingering close; the buffer is pooled and held only while one
// connection lingers.
const lingerBufSize = 16 << 10

var lingerBufs = sync.Pool{New: func() any { b := make([]byte, lingerBufSize); return &b }}

// drain is the lingering close's read-and-discard loop (the read deadline was set by startLinger).
func (c *limitConn) drain() {
	buf := lingerBufs.Get().(*[]byte)
	var n int64
	result := metrics.LingerBytes
	for n < c.l.linger.bytes {
		k, err := c.Conn.Read((*buf)[:min(int64(len(*buf)), c.l.linger.bytes-n)])
		n += int64(k)
		if err != nil {
			var ne net.Error
			switch {
			case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
				result = metrics.LingerEOF
			case c.shutdown.Load():
				result = metrics.LingerShutdown
			case errors.As(err, &ne) && ne.Timeout():
				result = metrics.LingerTime
			default:
				result = metrics.LingerError
			}
			break
		}
	}
	lingerBufs.Put(buf)
	c.close()
	c.l.endLinger(c, result)
}

// lingerOnClose marks a client connection (plain or TLS) for a lingering close on its next Close; other
// connections are left alone.
func lingerOnClose(conn net.Conn) {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	if lc, ok := conn.(interface{ lingerOnClose() }); ok {
		lc.lingerOnClose()
	}
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
