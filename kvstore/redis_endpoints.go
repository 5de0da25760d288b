package kvstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
)

var (
	scriptEndpointsRead  = script("policy_lib", "endpoints_read")
	scriptEndpointsSeed  = script("policy_lib", "endpoints_seed")
	scriptEndpointsWrite = script("policy_lib", "endpoints_write")
)

var _ Endpoints = (*RedisBlobs)(nil)

// Endpoint-set keys (beside the fleet state, in the {blobs} hash slot, so Reseed writes them in its step):
//
//	<base>{blobs}:endpoints       HASH   endpoint ID -> record JSON (EndpointRecord)
//	<base>{blobs}:endpoints:rev   STRING the set's revision; absent: not seeded (fresh, or restarted empty)

func recordJSON(r EndpointRecord) string {
	b, _ := json.Marshal(r) // plain fields and a RawMessage checked by the caller: cannot fail
	return string(b)
}

// endpointSetReply parses {marker, rev, (id, json)...}.
func endpointSetReply(op string, res []any) (EndpointSet, error) {
	if len(res) < 2 || len(res)%2 != 0 {
		return EndpointSet{}, fmt.Errorf("kvstore: redis %s: reply of %d values", op, len(res))
	}
	s := EndpointSet{Marker: str(res[0]), Records: make([]EndpointRecord, 0, len(res)/2-1)}
	rev, err := strconv.ParseUint(str(res[1]), 10, 64)
	if err != nil {
		return EndpointSet{}, fmt.Errorf("kvstore: redis %s: revision %v", op, res[1])
	}
	s.Rev = rev
	for i := 2; i+1 < len(res); i += 2 {
		var r EndpointRecord
		if err := json.Unmarshal([]byte(str(res[i+1])), &r); err != nil {
			return EndpointSet{}, fmt.Errorf("kvstore: redis %s: record %s: %w", op, str(res[i]), err)
		}
		r.ID = str(res[i])
		s.Records = append(s.Records, r)
	}
	sortRecords(s.Records)
	return s, nil
}

// ReadEndpoints implements Endpoints (one EVALSHA).
func (r *RedisBlobs) ReadEndpoints(ctx context.Context) (EndpointSet, error) {
	res, err := r.policyRun(ctx, scriptEndpointsRead)
	if err != nil {
		return EndpointSet{}, fmt.Errorf("kvstore: redis read endpoints: %w", err)
	}
	return endpointSetReply("read endpoints", res)
}

// SeedEndpoints implements Endpoints (one EVALSHA).
func (r *RedisBlobs) SeedEndpoints(ctx context.Context, recs []EndpointRecord) (EndpointSet, bool, error) {
	if err := checkRecords("seed endpoints", recs, nil); err != nil {
		return EndpointSet{}, false, err
	}
	args := []any{len(recs)}
	for _, e := range recs {
		args = append(args, e.ID, recordJSON(e))
	}
	res, err := r.policyRun(ctx, scriptEndpointsSeed, args...)
	if err != nil {
		return EndpointSet{}, false, fmt.Errorf("kvstore: redis seed endpoints: %w", err)
	}
	if len(res) < 1 {
		return EndpointSet{}, false, fmt.Errorf("kvstore: redis seed endpoints: empty reply")
	}
	s, err := endpointSetReply("seed endpoints", res[1:])
	return s, num(res[0]) == 1, err
}

// WriteEndpoints implements Endpoints (one EVALSHA).
func (r *RedisBlobs) WriteEndpoints(ctx context.Context, ifRev uint64, put []EndpointRecord, del []string) (EndpointSet, error) {
	if err := checkRecords("write endpoints", put, del); err != nil {
		return EndpointSet{}, err
	}
	args := []any{strconv.FormatUint(ifRev, 10), len(put)}
	for _, e := range put {
		args = append(args, e.ID, recordJSON(e))
	}
	args = append(args, len(del))
	for _, id := range del {
		args = append(args, id)
	}
	res, err := r.policyRun(ctx, scriptEndpointsWrite, args...)
	if err != nil {
		return EndpointSet{}, fmt.Errorf("kvstore: redis write endpoints: %w", err)
	}
	if len(res) == 0 {
		return EndpointSet{}, fmt.Errorf("kvstore: redis write endpoints: empty reply")
	}
	switch st := str(res[0]); st {
	case "ok":
		return endpointSetReply("write endpoints", res[1:])
	case "notseeded":
		return EndpointSet{}, fmt.Errorf("kvstore: write endpoints: %w", ErrNotSeeded)
	case "stale":
		return EndpointSet{}, fmt.Errorf("kvstore: write endpoints at revision %d (stored %v): %w", ifRev, res[1:], ErrStale)
	default:
		return EndpointSet{}, fmt.Errorf("kvstore: redis write endpoints: reply %q", st)
	}
}
