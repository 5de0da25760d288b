package kvstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	scriptPolicySeed     = script("policy_lib", "policy_seed")
	scriptPolicyFloor    = script("policy_lib", "policy_floor")
	scriptPolicyActivate = script("policy_lib", "policy_activate")
	scriptPolicyRollback = script("policy_lib", "policy_rollback")
	scriptPolicyUnload   = script("policy_lib", "policy_unload")
	scriptPolicyRead     = script("policy_lib", "policy_read")
	scriptPolicyReseed   = script("policy_lib", "policy_reseed")
	scriptPolicyServing  = script("policy_lib", "policy_serving")
)

var _ Policies = (*RedisBlobs)(nil)

// Fleet-state keys (layout 2 of the fleet state, inside key layout v1; all in the {blobs} hash slot):
//
//	<base>{blobs}:stack:<model>   LIST   "<version> <config JSON>", the floor first, the active entry last
//	<base>{blobs}:models          SET    models that have a stack
//	<base>{blobs}:epoch           STRING the fleet-state marker (Reseed); gone after an empty restart
//	<base>{blobs}:serving:<gw>    STRING a gateway's serving report, PX = its TTL
//	<base>{blobs}:gateways        ZSET   gateway -> report expiry (server clock, ms)
//	<base>{blobs}:active          HASH   layout-1 active values, kept equal to each stack's top

func (r *RedisBlobs) policyRun(ctx context.Context, s *redis.Script, args ...any) ([]any, error) {
	argv := append([]any{r.k(""), r.base + "changes"}, args...)
	res, err := s.Run(ctx, r.c, []string{r.k("index")}, argv...).Slice()
	if err != nil {
		return nil, err
	}
	return res, nil
}

func entryString(e PolicyEntry) string {
	cfg := e.Config
	if len(cfg) == 0 {
		cfg = []byte("{}")
	}
	return e.Version + " " + string(cfg)
}

func parseEntry(s string) PolicyEntry {
	v, cfg, _ := strings.Cut(s, " ")
	return PolicyEntry{Version: v, Config: []byte(cfg)}
}

func str(x any) string {
	switch v := x.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return fmt.Sprint(x)
}

func num(x any) int {
	switch v := x.(type) {
	case int64:
		return int(v)
	case string:
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}

// stackResult maps a script's {'ok', entries...} or {'<status>', ...} reply.
func stackResult(op, model, version string, res []any) ([]PolicyEntry, error) {
	if len(res) == 0 {
		return nil, fmt.Errorf("kvstore: redis %s %s: empty reply", op, model)
	}
	switch st := str(res[0]); st {
	case "ok":
		out := make([]PolicyEntry, 0, len(res)-1)
		for _, x := range res[1:] {
			out = append(out, parseEntry(str(x)))
		}
		return out, nil
	case "nostack":
		return nil, fmt.Errorf("kvstore: %s %s: %w", op, model, ErrNoStack)
	case "noblob":
		return nil, fmt.Errorf("kvstore: %s %s: blob %q: %w", op, model, version, ErrNotFound)
	case "stale":
		return nil, fmt.Errorf("kvstore: %s %s: %w", op, model, ErrStale)
	case "noprev":
		return nil, fmt.Errorf("kvstore: %s %s: %w", op, model, ErrNoPrevious)
	default:
		return nil, fmt.Errorf("kvstore: redis %s %s: reply %q", op, model, st)
	}
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// SeedStack implements Policies (one EVALSHA).
func (r *RedisBlobs) SeedStack(ctx context.Context, model string, floor PolicyEntry, needBlob bool) ([]PolicyEntry, error) {
	if err := checkEntry("seed stack", model, floor); err != nil {
		return nil, err
	}
	res, err := r.policyRun(ctx, scriptPolicySeed, model, entryString(floor), floor.Version, boolArg(needBlob))
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis seed stack: %w", err)
	}
	return stackResult("seed stack", model, floor.Version, res)
}

// SetFloor implements Policies (one EVALSHA).
func (r *RedisBlobs) SetFloor(ctx context.Context, model string, floor PolicyEntry, needBlob bool) ([]PolicyEntry, error) {
	if err := checkEntry("set floor", model, floor); err != nil {
		return nil, err
	}
	res, err := r.policyRun(ctx, scriptPolicyFloor, model, entryString(floor), floor.Version, boolArg(needBlob))
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis set floor: %w", err)
	}
	return stackResult("set floor", model, floor.Version, res)
}

// Activate implements Policies (one EVALSHA).
func (r *RedisBlobs) Activate(ctx context.Context, model string, e PolicyEntry, o ActivateOptions) ([]PolicyEntry, error) {
	if err := checkEntry("activate", model, e); err != nil {
		return nil, err
	}
	res, err := r.policyRun(ctx, scriptPolicyActivate, model, entryString(e), e.Version, boolArg(o.NeedBlob),
		boolArg(o.IfLegacy != nil), string(o.IfLegacy), MaxStackDepth)
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis activate: %w", err)
	}
	return stackResult("activate", model, e.Version, res)
}

// Rollback implements Policies (one EVALSHA).
func (r *RedisBlobs) Rollback(ctx context.Context, model, ifTop string) ([]PolicyEntry, error) {
	if model == "" {
		return nil, fmt.Errorf("kvstore: rollback: empty model: %w", ErrInvalidArgument)
	}
	res, err := r.policyRun(ctx, scriptPolicyRollback, model, ifTop)
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis rollback: %w", err)
	}
	return stackResult("rollback", model, "", res)
}

// Unload implements Policies (one EVALSHA).
func (r *RedisBlobs) Unload(ctx context.Context, version string) error {
	if version == "" {
		return fmt.Errorf("kvstore: unload: empty version: %w", ErrInvalidArgument)
	}
	res, err := r.policyRun(ctx, scriptPolicyUnload, version)
	if err != nil {
		return fmt.Errorf("kvstore: redis unload: %w", err)
	}
	switch st := str(res[0]); st {
	case "ok":
		return nil
	case "noblob":
		return fmt.Errorf("kvstore: unload %q: %w", version, ErrNotFound)
	case "inuse":
		if len(res) == 3 {
			return &PolicyInUseError{Version: version, Role: str(res[1]), Model: str(res[2])}
		}
	}
	return fmt.Errorf("kvstore: redis unload %s: reply %v", version, res)
}

// ReadFleet implements Policies (one EVALSHA).
func (r *RedisBlobs) ReadFleet(ctx context.Context) (Fleet, error) {
	res, err := r.policyRun(ctx, scriptPolicyRead)
	if err != nil {
		return Fleet{}, fmt.Errorf("kvstore: redis read fleet: %w", err)
	}
	f := Fleet{Stacks: map[string][]PolicyEntry{}, Legacy: map[string][]byte{}, Blobs: []BlobInfo{}}
	i := 0
	next := func() any {
		if i >= len(res) {
			return ""
		}
		i++
		return res[i-1]
	}
	f.Epoch = str(next())
	for range num(next()) {
		m := str(next())
		s := make([]PolicyEntry, 0, 4)
		for range num(next()) {
			s = append(s, parseEntry(str(next())))
		}
		f.Stacks[m] = s
	}
	for range num(next()) {
		m := str(next())
		f.Legacy[m] = []byte(str(next()))
	}
	for range num(next()) {
		f.Blobs = append(f.Blobs, BlobInfo{Name: str(next()), SHA256: str(next()), Size: num(next())})
	}
	if i != len(res) {
		return Fleet{}, fmt.Errorf("kvstore: redis read fleet: reply of %d values, parsed %d", len(res), i)
	}
	sortBlobs(f.Blobs)
	return f, nil
}

// Reseed implements Policies (one EVALSHA carrying every module: a few MB).
func (r *RedisBlobs) Reseed(ctx context.Context, epoch string, st FleetState) (string, bool, error) {
	if epoch == "" {
		return "", false, fmt.Errorf("kvstore: reseed: empty epoch: %w", ErrInvalidArgument)
	}
	args := []any{epoch, len(st.Blobs)}
	for _, b := range st.Blobs {
		if err := checkDigest(b.Name, b.SHA256, b.Data); err != nil {
			return "", false, err
		}
		args = append(args, b.Name, strings.ToLower(b.SHA256), b.Data)
	}
	args = append(args, len(st.Stacks))
	for model, s := range st.Stacks {
		if len(s) == 0 {
			return "", false, fmt.Errorf("kvstore: reseed: empty stack for %s: %w", model, ErrInvalidArgument)
		}
		args = append(args, model, len(s))
		for _, e := range s {
			if err := checkEntry("reseed", model, e); err != nil {
				return "", false, err
			}
			args = append(args, entryString(e))
		}
	}
	if err := checkRecords("reseed", st.Endpoints, nil); err != nil {
		return "", false, err
	}
	if st.Endpoints == nil {
		args = append(args, -1)
	} else {
		args = append(args, len(st.Endpoints))
		for _, e := range st.Endpoints {
			args = append(args, e.ID, recordJSON(e))
		}
	}
	res, err := r.policyRun(ctx, scriptPolicyReseed, args...)
	if err != nil {
		return "", false, fmt.Errorf("kvstore: redis reseed: %w", err)
	}
	if len(res) != 2 {
		return "", false, fmt.Errorf("kvstore: redis reseed: reply %v", res)
	}
	return str(res[0]), num(res[1]) == 1, nil
}

// ReportServing implements Policies (one EVALSHA; expiry on the server's clock).
func (r *RedisBlobs) ReportServing(ctx context.Context, gateway string, report []byte, ttl time.Duration) error {
	if gateway == "" || ttl <= 0 {
		return fmt.Errorf("kvstore: report serving: gateway %q ttl %v: %w", gateway, ttl, ErrInvalidArgument)
	}
	if _, err := r.policyRun(ctx, scriptPolicyServing, gateway, report, msCeil(ttl)); err != nil {
		return fmt.Errorf("kvstore: redis report serving: %w", err)
	}
	return nil
}

// ListServing implements Policies (one EVALSHA).
func (r *RedisBlobs) ListServing(ctx context.Context) (map[string][]byte, error) {
	res, err := r.policyRun(ctx, scriptPolicyServing, "")
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis list serving: %w", err)
	}
	out := make(map[string][]byte, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		out[str(res[i])] = []byte(str(res[i+1]))
	}
	return out, nil
}
