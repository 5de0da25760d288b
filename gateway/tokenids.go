package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/driftguard"
	"github.com/kvgate/kvgate/gateway/internal/endpoints"
	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
)

// tokenIDs is the gateway's chat token-ID forwarding: each endpoint's chat_token_ids field and the drift
// guard that decides whether it may be used now.
type tokenIDs struct {
	mu    sync.RWMutex
	modes map[string]string // endpoint ID → config.ChatTokenIDs* (off when absent)
	guard *driftguard.Guard
}

// setMode records e's chat_token_ids (an endpoint added or changed at run time). An endpoint added at run
// time is not in the drift guard, which allows token IDs only to the endpoints it verified: it gets
// original chat bodies (always correct) until the gateway restarts.
func (t *tokenIDs) setMode(e config.Endpoint) {
	mode := e.ChatTokenIDs
	if mode == "" {
		mode = config.DefaultChatTokenIDs[e.Engine]
	}
	t.mu.Lock()
	t.modes[e.ID] = mode
	t.mu.Unlock()
}

// newTokenIDs builds the chat token-ID state for cfg's endpoints; the guard's probes are not run yet.
func newTokenIDs(g *Gateway, cfg *config.Config, encoders map[string]route.Encoder, eps *endpoints.Set) *tokenIDs {
	t := &tokenIDs{modes: map[string]string{}}
	var guarded []driftguard.Endpoint
	encs := map[string]driftguard.Encoder{}
	for _, m := range cfg.Models {
		encs[m.Name] = encoders[m.Name]
		for _, e := range m.Endpoints {
			mode := e.ChatTokenIDs
			if mode == "" {
				mode = config.DefaultChatTokenIDs[e.Engine]
			}
			t.modes[e.ID] = mode
			if mode != config.ChatTokenIDsOff {
				guarded = append(guarded, driftguard.Endpoint{ID: e.ID, Model: m.Name, Engine: e.Engine, URL: e.URL})
			}
		}
	}
	every := config.DefaultVerifyTokenIDsEvery
	if cfg.VerifyTokenIDsEvery != nil {
		every = *cfg.VerifyTokenIDsEvery
	}
	t.guard = driftguard.New(driftguard.Options{Endpoints: guarded, Encoders: encs, HTTP: g.upHTTP,
		Healthy: func(id string) bool { return eps.Load(id).Healthy }, Every: every,
		ResumeMatches: cfg.TokenIDsResumeMatches, RecheckInterval: cfg.TokenIDsRecheckInterval,
		Timeout: 5 * time.Second, Registry: g.metrics.Registry, Log: g.log})
	return t
}

// start runs one probe round on the healthy endpoints (bounded by ctx), then the guard's loop until run ends.
func (t *tokenIDs) start(ctx, run context.Context, g *Gateway) {
	t.guard.CheckAll(ctx)
	g.wg.Go(func() { t.guard.Run(run) })
}

// engineBody is server.Options.EngineBody: completions as upstream.Body builds them; chat with its token
// IDs in the endpoint's chat_token_ids field while the drift guard allows it, else the client's body,
// counted by reason in kvgate_token_ids_skipped_total.
func (t *tokenIDs) engineBody(req *openai.Request, p *route.Plan, c route.Candidate, body []byte) ([]byte, error) {
	if req.API != openai.Chat {
		return t.completionBody(req, p, c, body)
	}
	t.mu.RLock()
	mode := t.modes[c.ID]
	t.mu.RUnlock()
	if mode == "" || mode == config.ChatTokenIDsOff {
		return body, nil
	}
	skip := p.TokenIDsSkip
	switch {
	case skip != "":
	case p.IDs == nil:
		return body, nil
	case upstream.HasMediaParts(body):
		skip = upstream.SkipMultimodal
	case !t.guard.Allow(c.ID):
		skip = upstream.SkipUnverified
	}
	if skip != "" {
		t.guard.Skipped(c.ID, skip)
		return body, nil
	}
	buf := idsJSONPool.Get().(*[]byte)
	f := appenderOf(p)
	var idsJSON []byte
	if f != nil {
		idsJSON = f.AppendIDsJSON((*buf)[:0], p.IDs, openai.AppendIDs)
	} else {
		idsJSON = openai.AppendIDs((*buf)[:0], p.IDs)
	}
	out, skip := upstream.ChatBodyJSONFor(req, mode, body, idsJSON)
	if cap(idsJSON) <= maxPooledIDsJSON {
		*buf = idsJSON[:0]
		idsJSONPool.Put(buf)
	}
	if skip != "" {
		t.guard.Skipped(c.ID, skip)
		return body, nil
	}
	t.guard.Sent(c.ID, body, p.IDs)
	return out, nil
}

// completionBody is engineBody for completions: upstream.Body's, with the prompt's IDs formatted through the
// model's ID-text cache where the encoder has one (a completion extending a cached prompt formats only its
// new IDs).
func (t *tokenIDs) completionBody(req *openai.Request, p *route.Plan, c route.Candidate, body []byte) ([]byte, error) {
	f := appenderOf(p)
	if f == nil || p.IDs == nil {
		return upstream.Body(c.Engine, req, body, p.IDs)
	}
	buf := idsJSONPool.Get().(*[]byte)
	out, err := upstream.BodyJSON(c.Engine, req, body, p.IDs, func(_ []byte, ids []uint32) []byte {
		*buf = f.AppendIDsJSON((*buf)[:0], ids, openai.AppendIDs)
		return *buf
	})
	if cap(*buf) <= maxPooledIDsJSON {
		*buf = (*buf)[:0]
		idsJSONPool.Put(buf)
	}
	return out, err
}

// appenderOf returns the plan's encoder as an idsJSONAppender, or nil.
func appenderOf(p *route.Plan) idsJSONAppender {
	if p.Model == nil {
		return nil
	}
	f, _ := p.Model.Encoder.(idsJSONAppender)
	return f
}

// idsJSONAppender is an encoder that formats the token IDs it returned as JSON faster than
// openai.AppendIDs, with the same text (gateway/internal/model.Model: a conversation's next turn formats only its
// new IDs).
type idsJSONAppender interface {
	AppendIDsJSON(dst []byte, ids []uint32, format func(dst []byte, ids []uint32) []byte) []byte
}

// idsJSONPool holds the buffers (*[]byte) engineBody writes a chat's token IDs into before splicing them
// into the engine body (which copies them); buffers over maxPooledIDsJSON bytes (a ~150k-token prompt)
// are dropped.
var idsJSONPool = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledIDsJSON = 1 << 20
