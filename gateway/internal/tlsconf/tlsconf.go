// Package tlsconf builds the gateway's TLS configurations from PEM files named in the config: the
// listener's (a certificate reloaded when its files change) and a client's (engines, Redis: a CA file and
// an optional client certificate for mutual TLS).
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Client returns a client TLS configuration: caFile ("" = the system's roots) is the PEM bundle that
// verifies the server; certFile and keyFile, both or neither, are the client certificate presented for
// mutual TLS; serverName, when set, is the name verified instead of the dialled host.
func Client(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("tlsconf: ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tlsconf: ca_file %s: no PEM certificate", caFile)
		}
		c.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("tlsconf: cert_file and key_file go together")
	}
	if certFile != "" {
		kp, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tlsconf: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c, nil
}

// ReloadCheck is how often, at most, the listener's certificate files are checked for a change (on a
// handshake; no goroutine).
const ReloadCheck = time.Second

// Server serves a certificate from certFile/keyFile and reloads it when either file's modification time or
// size changes (checked on a handshake at most every ReloadCheck). A reload that fails keeps the previous
// certificate and logs why.
type Server struct {
	certFile, keyFile string
	log               *slog.Logger
	cert              atomic.Pointer[tls.Certificate]
	mu                sync.Mutex
	stamp             string
	checked           atomic.Int64 // unix nanoseconds of the last check
}

// NewServer loads the certificate once (an error here stops the start).
func NewServer(certFile, keyFile string, log *slog.Logger) (*Server, error) {
	s := &Server{certFile: certFile, keyFile: keyFile, log: log}
	st, err := s.fileStamp()
	if err != nil {
		return nil, err
	}
	kp, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: listener certificate: %w", err)
	}
	s.cert.Store(&kp)
	s.stamp = st
	s.checked.Store(time.Now().UnixNano())
	return s, nil
}

// Config returns the listener's TLS configuration (HTTP/1.1 only: the server is fasthttp).
func (s *Server) Config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.current(), nil }}
}

func (s *Server) fileStamp() (string, error) {
	a, err := os.Stat(s.certFile)
	if err != nil {
		return "", fmt.Errorf("tlsconf: cert_file: %w", err)
	}
	b, err := os.Stat(s.keyFile)
	if err != nil {
		return "", fmt.Errorf("tlsconf: key_file: %w", err)
	}
	return fmt.Sprint(a.ModTime().UnixNano(), a.Size(), b.ModTime().UnixNano(), b.Size()), nil
}

func (s *Server) current() *tls.Certificate {
	now := time.Now().UnixNano()
	last := s.checked.Load()
	if now-last < int64(ReloadCheck) || !s.checked.CompareAndSwap(last, now) {
		return s.cert.Load()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.fileStamp()
	if err != nil || st == s.stamp {
		return s.cert.Load()
	}
	kp, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		// Half-written files (the key before the certificate): keep serving the old one; retried later.
		s.log.Warn("listener certificate changed but does not load; serving the previous one", slog.String("error", err.Error()))
		return s.cert.Load()
	}
	s.cert.Store(&kp)
	s.stamp = st
	s.log.Info("listener certificate reloaded", slog.String("cert_file", s.certFile))
	return &kp
}
