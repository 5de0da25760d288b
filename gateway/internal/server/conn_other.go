//go:build !linux

package server

import "net"

// peerClosed cannot peek portably; off Linux only failed writes detect a disconnect.
func peerClosed(net.Conn) (closed bool, ok bool) { return false, false }

// canPoll says whether peerClosed works on conn: never off Linux.
func canPoll(net.Conn) bool { return false }
