package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/kvevents"
)

// Ingestion lease timing: a dead gateway's endpoints are taken over within IngestLeaseTTL + IngestLeaseTick.
const (
	IngestLeaseTTL  = 3 * time.Second
	IngestLeaseTick = time.Second
)

func holderID() string {
	var b [6]byte
	rand.Read(b[:])
	h, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", h, os.Getpid(), hex.EncodeToString(b[:]))
}

func (g *Gateway) ingesterConfig(m config.Model, e config.Endpoint) kvevents.IngesterConfig {
	return kvevents.IngesterConfig{Endpoint: kvstore.EndpointID(e.ID), Model: m.Name, EventsAddr: e.KVEvents,
		ReplayAddr: e.KVReplay, BlockSize: m.BlockSize, Hasher: kvstore.Hasher{Seed: g.cfg.BlockKeySeed},
		Index: g.index, Logger: g.log, UnconfirmedTTL: g.cfg.IndexUnconfirmedTTL, ReplayTimeout: g.cfg.IndexReplayTimeout,
		ReplayTimeoutPerBatch: g.cfg.IndexReplayTimeoutPerBatch, Instance: g.engineInstance(e.ID),
		DataParallelSize: e.Ranks(), MaxHashes: g.cfg.IndexMaxEngineHashesPerEndpoint}
}

// engineInstance returns endpoint id's instance identity for kvevents.IngesterConfig.Instance: its
// process_start_time_seconds scraped now ("" when it exports none).
func (g *Gateway) engineInstance(id string) func(ctx context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		if g.eps == nil {
			return "", nil
		}
		st, err := g.eps.StartTime(ctx, id)
		if err != nil || st == 0 {
			return "", err
		}
		return instanceID(st), nil
	}
}

// instanceID formats an engine start time as an instance identity.
func instanceID(start float64) string { return strconv.FormatFloat(start, 'f', -1, 64) }

// noteStartTime passes a scraped engine start time to the endpoint's ingester, if this gateway runs it: a
// restarted engine's entries are dropped as soon as its metrics show the new start.
func (g *Gateway) noteStartTime(id string, start float64) {
	g.ingMu.Lock()
	in := g.ingesters[id]
	g.ingMu.Unlock()
	if in != nil {
		in.NoteInstance(instanceID(start))
	}
}

// fencedIndex returns the index view an ingester of endpoint id under model writes through with lease
// token tok: the fence is raised first, so writes of an earlier holder of the lease (a gateway paused or
// cut off past its lease) are refused from now on (kvstore.Fencer, RATIONALE "Fenced ingestion").
func (g *Gateway) fencedIndex(ctx context.Context, model, id string, tok int64) (kvstore.Index, error) {
	fr, ok := g.index.(kvstore.Fencer)
	if !ok {
		return g.index, nil
	}
	f := kvstore.Fence{Scope: id, Token: tok}
	if err := fr.RaiseFence(ctx, model, f); err != nil {
		return nil, fmt.Errorf("raise the ingestion fence: %w", err)
	}
	return fr.Fenced(f), nil
}

// runIngestion ingests e's KV events while this gateway holds the store lease "ingest:<model>/<id>"; another
// gateway takes over within a few seconds when this one dies or loses the store. Returns when ctx ends.
func (g *Gateway) runIngestion(ctx context.Context, m config.Model, e config.Endpoint) {
	name := "ingest:" + m.Name + "/" + e.ID
	var in *kvevents.Ingester
	var token int64
	var lastRenew time.Time
	stop := func(why string) {
		if in == nil {
			return
		}
		in.Close()
		g.ingMu.Lock()
		delete(g.ingesters, e.ID)
		g.ingMu.Unlock()
		in = nil
		g.log.Info("stopped ingesting endpoint events", slog.String("endpoint_id", e.ID), slog.String("reason", why))
	}
	defer func() {
		if in != nil {
			stop("shutdown")
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			g.store.Leases.ReleaseLease(rctx, name, g.holder, token)
			cancel()
		}
	}()
	t := time.NewTicker(IngestLeaseTick)
	defer t.Stop()
	for {
		opCtx, cancel := context.WithTimeout(ctx, IngestLeaseTick)
		if in == nil {
			tok, ok, err := g.store.Leases.AcquireLease(opCtx, name, g.holder, IngestLeaseTTL)
			if err == nil && ok {
				cfg := g.ingesterConfig(m, e)
				var nerr error
				cfg.Index, nerr = g.fencedIndex(opCtx, m.Name, e.ID, tok)
				var ni *kvevents.Ingester
				if nerr == nil {
					ni, nerr = kvevents.NewIngester(cfg)
				}
				if nerr == nil {
					nerr = ni.Start(ctx)
				}
				if nerr != nil {
					g.log.Error("cannot ingest endpoint events", slog.String("endpoint_id", e.ID), slog.String("error", nerr.Error()))
					g.store.Leases.ReleaseLease(opCtx, name, g.holder, tok)
				} else {
					in, token, lastRenew = ni, tok, time.Now()
					g.ingMu.Lock()
					g.ingesters[e.ID] = in
					g.ingMu.Unlock()
					g.log.Info("ingesting endpoint events", slog.String("endpoint_id", e.ID), slog.Int64("lease_token", tok))
				}
			}
		} else if in.Stats().Fenced {
			// The index refused a write: another gateway holds the endpoint with a newer token.
			stop("fenced off: another gateway took the endpoint over")
		} else {
			ok, err := g.store.Leases.RenewLease(opCtx, name, g.holder, token, IngestLeaseTTL)
			switch {
			case err == nil && ok:
				lastRenew = time.Now()
			case err == nil && !ok:
				stop("lease lost")
			case time.Since(lastRenew)+IngestLeaseTick >= IngestLeaseTTL:
				// Stop before the lease can expire on the store, so a gateway taking over never overlaps
				// with us for more than a moment.
				stop("store unreachable: lease about to expire")
			}
		}
		cancel()
		g.ingMu.Lock()
		if g.leaseRounds == nil {
			g.leaseRounds = map[string]uint64{}
		}
		g.leaseRounds[e.ID]++
		g.ingMu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
