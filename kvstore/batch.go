package kvstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Update is one Add (Remove false) or Remove (Remove true) of keys held by Endpoint on Tier, for
// Batcher.Apply.
type Update struct {
	Endpoint EndpointID
	Tier     Tier
	Remove   bool
	Keys     []BlockKey
}

// Batcher is Index's Apply on its own (Index includes it; kept for callers that need only Apply).
type Batcher interface {
	Apply(ctx context.Context, model string, updates []Update) error
}

var (
	_ Batcher = (*MemoryIndex)(nil)
	_ Batcher = (*RedisIndex)(nil)
)

func checkUpdates(model string, updates []Update) error {
	for _, u := range updates {
		if err := checkNames("apply", model, u.Endpoint); err != nil {
			return err
		}
		if err := checkTier("apply", u.Tier); err != nil {
			return err
		}
	}
	return nil
}

// Apply implements Index.
func (m *MemoryIndex) Apply(ctx context.Context, model string, updates []Update) error {
	if err := checkUpdates(model, updates); err != nil {
		return err
	}
	for _, u := range updates {
		var err error
		if u.Remove {
			err = m.Remove(ctx, model, u.Endpoint, u.Tier, u.Keys)
		} else {
			err = m.Add(ctx, model, u.Endpoint, u.Tier, u.Keys)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Apply implements Index: one pipeline of EVALSHA calls (on NOSCRIPT the scripts are loaded and the
// whole batch is sent again, which is safe because updates are idempotent in sequence).
func (r *RedisIndex) Apply(ctx context.Context, model string, updates []Update) error {
	return r.apply(ctx, nil, model, updates)
}

// apply is Apply, every script fenced by f unless nil (each update's script checks the fence, so a fence
// raised halfway refuses the rest).
func (r *RedisIndex) apply(ctx context.Context, f *Fence, model string, updates []Update) error {
	if err := checkUpdates(model, updates); err != nil {
		return err
	}
	send := func() error {
		p := r.c.Pipeline()
		n := 0
		for _, u := range updates {
			if len(u.Keys) == 0 {
				continue
			}
			names, args := r.blockKeys(model, []string{r.modelPrefix(model) + "e:" + string(u.Endpoint)}, u.Keys, string(u.Endpoint), int(u.Tier))
			s := scriptIndexAdd
			if u.Remove {
				s = scriptIndexRemove
			} else {
				args = append(args, r.epCap)
			}
			s, names, args = r.fencedCall(model, f, s, names, args)
			s.EvalSha(ctx, p, names, args...)
			n++
		}
		if n == 0 {
			return nil
		}
		_, err := p.Exec(ctx)
		return err
	}
	err := send()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		for _, s := range []*redis.Script{scriptIndexAdd, scriptIndexRemove, scriptFencedAdd, scriptFencedRemove} {
			if lerr := s.Load(ctx, r.c).Err(); lerr != nil {
				return fmt.Errorf("kvstore: redis apply: load script: %w", lerr)
			}
		}
		err = send()
	}
	if err != nil {
		return redisErr("apply", err)
	}
	return nil
}
