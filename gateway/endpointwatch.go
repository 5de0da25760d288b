package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/kvstore"
)

// startEndpointSync registers the configured endpoints as running, reads the store's endpoint set once
// (seeding it when the store has none), and starts following the store, the config file (when
// Options.ConfigPath is set) and each model's endpoints_from.
func (g *Gateway) startEndpointSync(ctx context.Context) error {
	s := newEndpointSync(g)
	g.epSync = s
	var file *config.Config
	var sum [32]byte
	if g.configPath != "" {
		b, err := os.ReadFile(g.configPath)
		if err != nil {
			return fmt.Errorf("gateway: config file: %w", err)
		}
		if file, err = config.Parse(b); err != nil {
			return fmt.Errorf("gateway: config file: %w", err)
		}
		sum = sha256.Sum256(b)
	}
	s.startConfigured(file)
	if g.store.StartErr == nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s.reconcile(rctx)
		cancel()
	}
	g.wg.Go(func() { s.run(g.runCtx) })
	if g.configPath != "" && g.cfg.ConfigWatchInterval > 0 {
		g.wg.Go(func() { g.watchConfig(g.runCtx, sum) })
	}
	for _, m := range g.cfg.Models {
		if m.EndpointsFrom != nil {
			g.wg.Go(func() { s.runDNS(g.runCtx, m) })
		}
	}
	return nil
}

// watchConfig re-reads the config file when its content changes (checked every config_watch_interval).
func (g *Gateway) watchConfig(ctx context.Context, last [32]byte) {
	t := time.NewTicker(g.cfg.ConfigWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b, err := os.ReadFile(g.configPath)
		if err != nil {
			continue // being replaced (an editor's rename): next tick
		}
		sum := sha256.Sum256(b)
		if sum == last {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = g.epSync.reloadFile(rctx, g.configPath)
		cancel()
		if err == nil || !isStoreRetry(err) {
			last = sum // a file that does not parse is reported once, not every tick
		}
	}
}

// isStoreRetry says whether a reload failed for the store (to be tried again) rather than the file.
func isStoreRetry(err error) bool {
	var ce *config.Error
	return !errors.As(err, &ce) && !errors.Is(err, config.ErrEmpty)
}

// resolver returns the resolver endpoints_from asks: addr (host:port) over UDP and TCP, else the
// system's.
func resolver(addr string) *net.Resolver {
	if addr == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}

// runDNS re-resolves m's endpoints_from every refresh and reconciles the store's records of that source.
func (s *endpointSync) runDNS(ctx context.Context, m config.Model) {
	f := m.EndpointsFrom
	r := resolver(f.Resolver)
	t := time.NewTicker(f.RefreshOrDefault())
	defer t.Stop()
	lastErr := ""
	for {
		rctx, cancel := context.WithTimeout(ctx, max(f.RefreshOrDefault(), 2*time.Second))
		err := s.resolveOnce(rctx, m, r)
		cancel()
		if msg := fmt.Sprint(err); err != nil && msg != lastErr && ctx.Err() == nil {
			s.g.log.Warn("endpoint discovery failed: the discovered endpoints stay as they are", slog.String("model", m.Name),
				slog.String("dns", f.DNS), slog.String("error", msg))
			lastErr = msg
		} else if err == nil {
			lastErr = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resolveOnce resolves m's endpoints_from name (A and AAAA) and writes the difference to the store: new
// addresses are added, addresses gone drain and are removed. A name that does not exist (NXDOMAIN, or no
// address) is an empty fleet; any other failure (timeout, SERVFAIL) changes nothing.
func (s *endpointSync) resolveOnce(ctx context.Context, m config.Model, r *net.Resolver) error {
	f := m.EndpointsFrom
	addrs, err := r.LookupIPAddr(ctx, f.DNS)
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound {
		addrs, err = nil, nil
	}
	if err != nil {
		return err
	}
	src := sourceDNSPre + f.DNS
	want := map[string]config.Endpoint{}
	for _, a := range addrs {
		ip := a.IP.String()
		if a.Zone != "" {
			ip += "%" + a.Zone
		}
		e := f.Endpoint(m.Name, ip)
		if strings.Contains(e.ID, "%") {
			continue // a zoned link-local address cannot name an endpoint
		}
		want[e.ID] = e
	}
	_, err = s.change(ctx, false, func(set kvstore.EndpointSet) ([]kvstore.EndpointRecord, []string, error) {
		var put []kvstore.EndpointRecord
		ids := make([]string, 0, len(want))
		for id := range want {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			spec := config.EndpointJSON(want[id])
			c, ok := set.Get(id)
			if ok && c.Source != src {
				continue // the same address put there by an operator: theirs
			}
			if ok && c.State == kvstore.EndpointActive && bytes.Equal(c.Spec, spec) {
				continue
			}
			put = append(put, kvstore.EndpointRecord{ID: id, Model: m.Name, Spec: spec, State: kvstore.EndpointActive, Source: src})
		}
		for _, c := range set.Records {
			if c.Source != src || c.Model != m.Name {
				continue
			}
			if _, ok := want[c.ID]; ok || (c.State == kvstore.EndpointDraining && c.Remove) || c.State == kvstore.EndpointDrained {
				continue
			}
			put = append(put, drainRecord(c, true))
		}
		return put, nil, nil
	})
	return err
}
