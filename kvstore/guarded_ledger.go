package kvstore

import (
	"math"
	"strconv"
	"sync"
	"time"
)

// ledger is Guarded's own account of every claim it holds, whatever store the claim's lease lives on
// (the shared store, or none while the store is down). It is the one number that survives a store outage or a
// store that comes back empty: the engines keep running what this gateway sent them, so the gateway keeps
// counting it until the response ends (or its lease expires unrenewed). See RATIONALE.md, "Guarded: the store
// owns store failure", and gateway/RATIONALE.md, "Why does every gateway keep its own ledger of in-flight
// requests?".
//
// Besides its own counts it remembers, per endpoint, what the rest of the fleet held at the last read of the
// shared counters (others = fleet in-flight − own, and own at that read), and, once the store goes down, a
// frozen base (both, as of that last read) from which the store-down cap is computed.
type ledger struct {
	share float64
	now   func() time.Time // Guarded's clock (backedUntil)

	mu     sync.Mutex
	seq    uint64 // numbers the IDs of local claims and renamed ones
	own    map[EndpointID]Cost
	claims map[string]*claim // by the lease ID handed out
	// expired remembers the IDs of claims dropped when their lease expired unrenewed (bounded: cleared when
	// full), so a late Renew says ErrLeaseNotLive rather than asking the store.
	expired map[string]struct{}
	// seen is, per endpoint, own and others at the last read of the shared counters: one consistent
	// picture of the fleet. The store-down base is taken from it, not from own at the moment the failure is
	// noticed (by then a gateway's requests may have finished while new ones wait on the failing store, and
	// a base of own≈0 against the others' earlier counts would leave no capacity at all).
	seen map[EndpointID]downBase
	// seenAt is when seen was last updated (Guarded's clock; zero before the first read).
	seenAt time.Time
	base   map[EndpointID]downBase // nil while the store is up

	// Onset hold (issue #11 item 5; 0 = off): the shared counters this gateway last read may be stale when
	// the store fails — another gateway may since have filled the capacity they showed free — so for up to
	// hold after the failure, until the engine's own load has been scraped after it, a gateway stays within
	// what it held at the failure (the store granted that: the fleet's holdings then add up to at most the
	// limit); afterwards the free share is computed from the engine's scraped in-flight count.
	hold   time.Duration
	margin time.Duration // a scrape counts as after the failure only this long after it (requests in transit)
	downAt time.Time
	engine map[EndpointID]engineSeen

	// stalled is set for an outage that began with timeouts (not refusals): the store may be alive and still
	// serving the other gateways, which then reserve on its counters alone. While stalled the store-down
	// caps also keep this gateway within what the store still counts for it (backedLocked): its claims'
	// store leases until their TTL, and the store leases of requests that ended while it was down (orphans,
	// whose release is deferred). Anything beyond would be capacity the others can take too.
	stalled bool
	orphans []orphan
}

// orphan is a store lease whose request ended while the store was down: the store keeps counting it for
// this gateway until its TTL passes (backedUntil, unix nanoseconds).
type orphan struct {
	ep          EndpointID
	cost        Cost
	backedUntil int64
}

// maxOrphans bounds ledger.orphans (beyond it they are forgotten: fewer requests, never more).
const maxOrphans = 1 << 14

// addOrphan records the store lease of claim c, whose request ended while the store was down.
func (l *ledger) addOrphan(c *claim) {
	until := c.backedUntil.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	if until > l.now().UnixNano() && len(l.orphans) < maxOrphans {
		l.orphans = append(l.orphans, orphan{c.ep, c.cost, until})
	}
}

// clearOrphans forgets the orphans and the stall (the store is up again: their releases are flushed or
// expired, and every claim is on the store).
func (l *ledger) clearOrphans() {
	l.mu.Lock()
	l.orphans, l.stalled = nil, false
	l.mu.Unlock()
}

// backedLocked is what the store still counts for this gateway on ep at now (unix nanoseconds): its live
// claims' store leases and its orphans, each until its backedUntil.
func (l *ledger) backedLocked(ep EndpointID, now int64) Cost {
	var b Cost
	for _, c := range l.claims {
		if c.ep == ep && c.backedUntil.Load() > now {
			b = addCost(b, c.cost)
		}
	}
	kept := l.orphans[:0]
	for _, o := range l.orphans {
		if o.backedUntil <= now {
			continue
		}
		kept = append(kept, o)
		if o.ep == ep {
			b = addCost(b, o.cost)
		}
	}
	l.orphans = kept
	return b
}

// downBase is one endpoint's state when the store went down: own and others at the last read of the shared
// counters, and atDown, this gateway's own holdings at the failure.
type downBase struct{ own, others, atDown Cost }

// engineSeen is one scrape of an engine's load: its requests running and waiting, this gateway's own
// in-flight requests on it at that moment, and when.
type engineSeen struct {
	inflight, own int64
	at            time.Time
}

// noteEngine records a scrape of ep's load (running + waiting requests) taken at.
func (l *ledger) noteEngine(ep EndpointID, inflight int64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.engine == nil {
		l.engine = map[EndpointID]engineSeen{}
	}
	l.engine[ep] = engineSeen{inflight: inflight, own: l.own[ep].Requests, at: at}
}

func newLedger(share float64) *ledger {
	return &ledger{share: share, now: time.Now, own: map[EndpointID]Cost{}, claims: map[string]*claim{},
		seen: map[EndpointID]downBase{}}
}

func addCost(a, b Cost) Cost {
	return Cost{Requests: a.Requests + b.Requests, Tokens: a.Tokens + b.Tokens}
}

func subCost(a, b Cost) Cost {
	return Cost{Requests: a.Requests - b.Requests, Tokens: a.Tokens - b.Tokens}
}

// addLocked counts c (its cost on its endpoint) under c.id, renaming c when another live claim holds that ID
// (a store restarted empty hands out the lease IDs of claims re-registered since).
func (l *ledger) addLocked(c *claim) {
	if c.id == "" {
		l.seq++
		c.id = guardIDPrefix + "local-" + strconv.FormatUint(l.seq, 10)
	} else if _, dup := l.claims[c.id]; dup {
		l.seq++
		c.id = guardIDPrefix + strconv.FormatUint(l.seq, 10) + ":" + c.id
	}
	l.claims[c.id] = c
	l.own[c.ep] = addCost(l.own[c.ep], c.cost)
}

// maxExpired bounds ledger.expired.
const maxExpired = 1 << 12

// expire stops counting c, whose lease expired unrenewed, and remembers its ID.
func (l *ledger) expire(c *claim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.claims[c.id] != c {
		return
	}
	l.removeLocked(c)
	if l.expired == nil || len(l.expired) >= maxExpired {
		l.expired = map[string]struct{}{}
	}
	l.expired[c.id] = struct{}{}
}

// wasExpired says whether id named a claim dropped on expiry.
func (l *ledger) wasExpired(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.expired[id]
	return ok
}

// lookup returns the live claim handed out as id, or nil.
func (l *ledger) lookup(id string) *claim {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.claims[id]
}

// addGranted counts c, a claim the store granted on one of cands, unless the router has since gone to
// store-down routing (up reports false, read under the ledger's lock) or checked (the recovery grace) and c
// does not fit its endpoint's store-down cap beside the claims counted meanwhile; it reports whether c is
// counted. The store's answer can arrive after the store failed and after store-down reservations (which
// never wait on the store) filled this gateway's cap: counting the grant then without the check put one
// request more on the engine than the caps allow (TestGrantAfterOutageOnset).
func (l *ledger) addGranted(c *claim, cands []Candidate, checked bool, up func() bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if checked || !up() {
		for _, cd := range cands {
			if cd.Endpoint == c.ep && !l.fitsLocked(cd, c.cost) {
				return false
			}
		}
	}
	l.addLocked(c)
	return true
}

// remove stops counting c; it reports false when c was not counted.
func (l *ledger) remove(c *claim) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.claims[c.id] != c {
		return false
	}
	l.removeLocked(c)
	return true
}

// removeLocked stops counting c, a counted claim.
func (l *ledger) removeLocked(c *claim) {
	delete(l.claims, c.id)
	u := subCost(l.own[c.ep], c.cost)
	if u.Requests <= 0 && u.Tokens <= 0 {
		delete(l.own, c.ep)
	} else {
		l.own[c.ep] = u
	}
}

// live returns the claims counted now.
func (l *ledger) live() []*claim {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*claim, 0, len(l.claims))
	for _, c := range l.claims {
		out = append(out, c)
	}
	return out
}

// ownCounts returns this gateway's in-flight cost on each of eps (endpoints with none omitted).
func (l *ledger) ownCounts(eps []EndpointID) map[EndpointID]Cost {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[EndpointID]Cost, len(eps))
	for _, e := range eps {
		if u, ok := l.own[e]; ok {
			out[e] = u
		}
	}
	return out
}

// observe records a read of the shared in-flight counters: others = fleet − own, per endpoint of eps.
func (l *ledger) observe(eps []EndpointID, fleet map[EndpointID]Cost) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range eps {
		own := l.own[e]
		o := subCost(fleet[e], own)
		l.seen[e] = downBase{own: own, others: Cost{Requests: max(o.Requests, 0), Tokens: max(o.Tokens, 0)}}
	}
	l.seenAt = l.now()
}

// pictureAt returns when the shared counters were last observed.
func (l *ledger) pictureAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seenAt
}

// freeze records the store-down base of every endpoint known. With keep, an existing base is kept instead (a
// store that fails again while this gateway is still recovering from the previous outage: the fleet's
// holdings are still bounded by that outage's caps, and the others' counts read since are not trusted).
func (l *ledger) freeze(keep bool, now time.Time, stalled bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stalled = stalled
	if keep && l.base != nil {
		return
	}
	l.downAt = now
	l.base = make(map[EndpointID]downBase, len(l.seen)+len(l.own))
	for e, b := range l.seen {
		b.atDown = l.own[e]
		l.base[e] = b
	}
	for e, u := range l.own {
		if _, ok := l.base[e]; !ok {
			l.base[e] = downBase{own: u, atDown: u}
		}
	}
}

// capOf is the store-down cap of one limit dimension (requests or tokens): at most floor(limit × share), and
// at most what this gateway held when the store went down plus floor(share × the capacity that was free).
// -1 means unlimited.
func capOf(limit int64, share float64, own0, others0 int64) int64 {
	if limit <= 0 {
		return -1
	}
	s := int64(math.Floor(float64(limit) * share))
	free := max(limit-others0-own0, 0)
	return max(min(s, own0+int64(math.Floor(float64(free)*share))), 0)
}

// capsLocked returns ep's store-down caps for limits, taking a base for an endpoint never read before (the
// others' holdings are then unknown and taken as 0).
func (l *ledger) capsLocked(ep EndpointID, lim Limits) (reqCap, tokCap int64) {
	if l.base == nil {
		l.base = map[EndpointID]downBase{}
	}
	b, ok := l.base[ep]
	if !ok {
		b = downBase{own: l.own[ep], atDown: l.own[ep]}
		l.base[ep] = b
	}
	reqCap = capOf(lim.MaxRequests, l.share, b.own.Requests, b.others.Requests)
	tokCap = capOf(lim.MaxTokens, l.share, b.own.Tokens, b.others.Tokens)
	if l.hold <= 0 || l.downAt.IsZero() {
		return reqCap, tokCap
	}
	es, seen := l.engine[ep]
	switch {
	case seen && es.at.After(l.downAt.Add(l.margin)) && lim.MaxRequests > 0:
		// The engine's load after the failure: everyone's requests on it. Others hold about
		// inflight − own then; this gateway may add its share of what is free beside them.
		others := max(es.inflight-es.own, 0)
		reqCap = min(reqCap, capOf(lim.MaxRequests, l.share, l.own[ep].Requests, others))
	case time.Since(l.downAt) < l.hold:
		// Nothing fresh yet: hold at what this gateway held at the failure.
		if reqCap >= 0 {
			reqCap = min(reqCap, b.atDown.Requests)
		}
		if tokCap >= 0 {
			tokCap = min(tokCap, b.atDown.Tokens)
		}
	}
	return reqCap, tokCap
}

// fitsLocked says whether cost more on c stays within its store-down caps. A token cost over the whole token
// cap counts as the cap (one such request may run alone).
func (l *ledger) fitsLocked(c Candidate, cost Cost) bool {
	rc, tc := l.capsLocked(c.Endpoint, c.Limits)
	u := l.own[c.Endpoint]
	if l.stalled {
		b := l.backedLocked(c.Endpoint, l.now().UnixNano())
		if rc >= 0 {
			rc = min(rc, b.Requests)
		}
		if tc >= 0 {
			tc = min(tc, b.Tokens)
		}
	}
	if rc >= 0 && u.Requests+cost.Requests > rc {
		return false
	}
	if tc >= 0 && (tc == 0 && cost.Tokens > 0 || u.Tokens+min(cost.Tokens, tc) > tc) {
		return false
	}
	return true
}

// reserveLocal counts a new claim on the first candidate (index into ranked) within its store-down cap, or
// returns -1.
func (l *ledger) reserveLocal(ranked []Candidate, cost Cost, mk func(Candidate) *claim) (*claim, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, c := range ranked {
		if !l.fitsLocked(c, cost) {
			continue
		}
		cl := mk(c)
		l.addLocked(cl)
		return cl, i
	}
	return nil, -1
}

// admissible returns the candidates of ranked within their store-down caps for cost (used while recovering,
// together with the store's own check).
func (l *ledger) admissible(ranked []Candidate, cost Cost) []Candidate {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Candidate, 0, len(ranked))
	for _, c := range ranked {
		if l.fitsLocked(c, cost) {
			out = append(out, c)
		}
	}
	return out
}

// counts returns the number of claims and how many of them have no lease on the current store.
func (l *ledger) counts(current string) (all, unregistered int) {
	for _, c := range l.live() {
		c.mu.Lock()
		if !c.onStore || c.epoch != current {
			unregistered++
		}
		c.mu.Unlock()
		all++
	}
	return all, unregistered
}
