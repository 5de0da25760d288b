package kvstore

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable says the store cannot serve now: it is unreachable, timed out, or answered that it cannot
// serve (see RedisUnavailable for which Redis replies count). Backends wrap the cause with it (match with
// errors.Is; the cause stays reachable through errors.As and errors.Is as well). The store's own refusals
// (ErrNoCapacity, ErrLeaseNotLive, ErrInvalidArgument, ErrFenced, ...) are never ErrUnavailable: the store
// answered. Guarded turns it into store-down routing.
var ErrUnavailable = errors.New("kvstore: store unavailable")

// unavailableError is ErrUnavailable with its cause.
type unavailableError struct{ cause error }

func (e *unavailableError) Error() string   { return "store unavailable: " + e.cause.Error() }
func (e *unavailableError) Unwrap() []error { return []error{ErrUnavailable, e.cause} }

// Unavailable wraps cause as ErrUnavailable (cause itself when it already is; nil for nil).
func Unavailable(cause error) error {
	if cause == nil || errors.Is(cause, ErrUnavailable) {
		return cause
	}
	return &unavailableError{cause}
}

// RedisUnavailable says whether err, returned by a go-redis command, means the Redis store cannot serve now:
//   - yes for anything that is not a Redis reply: connection refused or reset, EOF, an I/O or dial timeout,
//     a deadline the caller set (a hung server: the store timeout), a closed client or an exhausted pool,
//     a connection refused by the epoch check (ErrEpochChanged);
//   - yes for the replies of a server that is up but cannot serve: LOADING (reading its data set at start),
//     BUSY (a script or module call runs past lua-time-limit), READONLY (a replica, e.g. after a failover),
//     CLUSTERDOWN, MASTERDOWN, TRYAGAIN (a slot in migration), max number of clients reached, OOM
//     (maxmemory reached: writes refused) and NOREPLICAS;
//   - no for every other reply (a script error, NOSCRIPT, WRONGTYPE, FENCED, NOAUTH: the server answered),
//     for redis.Nil, and for a cancelled context (the caller went away; the store may be fine).
func RedisUnavailable(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	if _, ok := errors.AsType[redis.Error](err); ok {
		return redis.IsLoadingError(err) || redis.HasErrorPrefix(err, "BUSY") || redis.IsReadOnlyError(err) ||
			redis.IsClusterDownError(err) || redis.IsMasterDownError(err) || redis.IsTryAgainError(err) ||
			redis.IsMaxClientsError(err) || redis.IsOOMError(err) || redis.IsNoReplicasError(err)
	}
	return true
}

// unavailableHook is the go-redis hook that makes every command's error ErrUnavailable when
// RedisUnavailable says so, below every kvstore call: the Redis backends return errors wrapped with %w, so
// callers see ErrUnavailable whatever call failed. OpenStore installs it; ClassifyRedisErrors installs it
// on a client built elsewhere.
type unavailableHook struct{}

var _ redis.Hook = unavailableHook{}

func classify(err error) error {
	if RedisUnavailable(err) {
		return Unavailable(err)
	}
	return err
}

func (unavailableHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (unavailableHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil {
			return nil
		}
		if c := classify(err); c != err {
			cmd.SetErr(c)
			return c
		}
		return err
	}
}

func (unavailableHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil {
			return nil
		}
		for _, cmd := range cmds {
			if e := cmd.Err(); e != nil {
				if c := classify(e); c != e {
					cmd.SetErr(c)
				}
			}
		}
		return classify(err)
	}
}

// ClassifyRedisErrors installs on c the hook that reports unreachability as ErrUnavailable (OpenStore does
// this for its own client; call it once on a client passed to NewRedisIndex, NewRedisReservations or
// NewRedisBlobs directly).
func ClassifyRedisErrors(c redis.UniversalClient) { c.AddHook(unavailableHook{}) }
