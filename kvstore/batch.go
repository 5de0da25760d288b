package kvstore

import (
	"context"
)

// Update is one Add (Remove false) or Remove (Remove true) of keys held by Endpoint on Tier, for
// Batcher.Apply.
type Update struct {
	Endpoint EndpointID
	Tier     Tier
	Remove   bool
	Keys     []BlockKey
	// Families, when it has one entry per key, gives each key's Family (layout 2 of the Redis index files a
	// block under its chain's family; the ingester knows it). Without it each key is taken as its own
	// chain's block 0 (FamilyOf(key)). The memory index and Redis layout 1 ignore it.
	Families []Family
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

// Apply implements Index: one pipeline of EVALSHA calls, one per writeSlice keys of each update (on
// NOSCRIPT the scripts are loaded and the whole batch is sent again, which is safe because updates are
// idempotent in sequence).
func (r *RedisIndex) Apply(ctx context.Context, model string, updates []Update) error {
	return r.apply(ctx, nil, "apply", model, updates)
}

// apply is Apply (and Add, Remove: op names the call in errors), every script fenced by f unless nil (each
// script checks the fence, so a fence raised halfway refuses the rest).
func (r *RedisIndex) apply(ctx context.Context, f *Fence, op string, model string, updates []Update) error {
	if err := checkUpdates(model, updates); err != nil {
		return err
	}
	mode := r.layoutNow(ctx)
	if mode == modeV2 {
		return r.applyV2(ctx, f, op, model, updates)
	}
	var calls []scriptCall
	for _, u := range updates {
		for i := 0; i < len(u.Keys); i += writeSlice {
			keys := u.Keys[i:min(i+writeSlice, len(u.Keys))]
			names, args := r.blockKeys(model, []string{r.modelPrefix(model) + "e:" + string(u.Endpoint)}, keys, string(u.Endpoint), int(u.Tier))
			s := scriptIndexAdd
			if u.Remove {
				s = scriptIndexRemove
			} else {
				args = append(args, r.epCap) // the endpoint's cap (index_add.lua), before the fence's argument
			}
			s, names, args = r.fencedCall(model, f, s, names, args)
			calls = append(calls, scriptCall{s, names, args})
		}
	}
	if len(calls) == 0 {
		return nil
	}
	if err := r.runScripts(ctx, calls); err != nil {
		return redisErr(op, err)
	}
	if mode == modeDual {
		return r.applyV2(ctx, f, op, model, updates)
	}
	return nil
}
