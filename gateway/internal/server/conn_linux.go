//go:build linux

package server

import (
	"net"
	"syscall"
)

// canPoll says whether peerClosed works on conn (a socket with a file descriptor), without a system call:
// watch asks this once per request.
func canPoll(conn net.Conn) bool {
	_, ok := conn.(syscall.Conn)
	return ok
}

// peerClosed reports whether the client closed its side of conn, without consuming any byte: a
// non-blocking MSG_PEEK recv returns 0 bytes at end of stream, EAGAIN while the connection is open and idle,
// and >0 when the client sent more (a pipelined request: still connected). See gateway/RATIONALE.md.
func peerClosed(conn net.Conn) (closed bool, ok bool) {
	sc, isSC := conn.(syscall.Conn)
	if !isSC {
		return false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var buf [1]byte
	var n int
	var rerr error
	cerr := rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	})
	if cerr != nil {
		return true, true // the conn is closed on our side
	}
	switch {
	case rerr == syscall.EAGAIN || rerr == syscall.EINTR:
		return false, true
	case rerr != nil:
		return true, true // ECONNRESET and friends
	case n == 0:
		return true, true // orderly shutdown (FIN)
	}
	return false, true
}
