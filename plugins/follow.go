package plugins

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
)

// Entry is one activation as a fleet's store names it: a loaded version and its JSON config.
type Entry struct {
	Version Version
	Config  []byte
}

func (a *activation) is(e Entry) bool {
	return a != nil && a.ver.v == e.Version && bytes.Equal(a.config, e.Config)
}

// Follow makes model run what a fleet's store says: active serves (its pool reused when it is the current
// or the warm activation, else built first, off the request path, and swapped in atomically), and warm (nil:
// none) is kept built beside it so the store's next rollback is an atomic swap too. The host keeps no history
// of its own: the store's activation stack is the history. Follow calls are serialized.
//
// Errors (the model keeps what it ran): ErrUnknownVersion (not loaded here), ErrVersionDisabled,
// ErrInitFailed (the guest's init rejected the config), ErrBadName, ErrClosed. A warm activation that
// cannot be built is not an error: the next rollback builds its pool then.
func (h *Host) Follow(model string, active Entry, warm *Entry) error {
	if h.closed.Load() {
		return ErrClosed
	}
	if model == "" {
		return fmt.Errorf("%w: empty model", ErrBadName)
	}
	h.followMu.Lock()
	defer h.followMu.Unlock()
	h.mu.Lock()
	st := h.stateLocked(model)
	cur := st.active.Load()
	var next *activation
	switch {
	case cur.is(active):
		next = cur
	case st.prev.is(active):
		next = st.prev
	}
	ver := h.versions[active.Version]
	h.mu.Unlock()
	if next == nil {
		if ver == nil {
			return fmt.Errorf("plugins: follow %s for %s: %w", active.Version, model, ErrUnknownVersion)
		}
		if ver.disabled.Load() {
			return fmt.Errorf("plugins: follow %s for %s: %w", active.Version, model, ErrVersionDisabled)
		}
		a, err := h.newActivation(context.Background(), model, ver, slices.Clone(active.Config))
		if err != nil {
			return fmt.Errorf("plugins: follow %s for %s: %w", active.Version, model, err)
		}
		next = a
	}
	h.mu.Lock()
	if next != cur && next != st.prev && (next.ver.unloaded.Load() || next.ver.disabled.Load()) { // while built
		h.mu.Unlock()
		next.retire()
		return fmt.Errorf("plugins: follow %s for %s: %w", active.Version, model, ErrVersionDisabled)
	}
	// Candidates for the warm slot: the previous warm one and the one that served until now.
	old := []*activation{st.prev}
	if next != cur {
		st.active.Store(next)
		h.swaps.Add(1)
		old = append(old, cur)
	}
	st.prev = nil
	for _, a := range old {
		switch {
		case a == nil || a == next:
		case warm != nil && st.prev == nil && a.is(*warm):
			st.prev = a
		default:
			a.retire()
		}
	}
	build := warm != nil && st.prev == nil && !next.is(*warm)
	var wver *version
	if build {
		wver = h.versions[warm.Version]
		build = wver != nil && !wver.disabled.Load()
	}
	h.mu.Unlock()
	if next != cur {
		h.log.LogAttrs(context.Background(), slog.LevelInfo, "policy follows the store", slog.String(attrModel, model),
			slog.String(attrPolicy, string(active.Version)))
	}
	if !build {
		return nil
	}
	w, err := h.newActivation(context.Background(), model, wver, slices.Clone(warm.Config))
	if err != nil {
		h.log.LogAttrs(context.Background(), slog.LevelDebug, "warm policy activation not built", slog.String(attrModel, model),
			slog.String(attrPolicy, string(warm.Version)), slog.String("error", err.Error()))
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed.Load() || st.prev != nil || st.active.Load() != next || wver.unloaded.Load() || wver.disabled.Load() {
		w.retire()
		return nil
	}
	st.prev = w
	return nil
}
