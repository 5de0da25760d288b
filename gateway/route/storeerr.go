package route

import (
	"context"
	"errors"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/gateway/openai"
	"github.com/kvgate/kvgate/kvstore"
)

// storeError handles a failed store operation op. Only an error saying the shared store cannot be reached
// (see unreachable) switches the router to store-down routing; any other error (an argument the store
// refused, a script error the server answered) is counted in kvgate_store_errors_total and logged, and the
// store stays up. It reports whether the store is now marked down.
func (r *Router) storeError(op string, err error) bool {
	if r.unreachable(err) {
		r.storeFailed(op, err)
		return true
	}
	r.o.Metrics.StoreErrors.WithLabelValues(op).Inc()
	r.o.Log.Warn("store refused an operation (the store stays up)", slog.String("op", op),
		slog.String("error", err.Error()))
	return false
}

// unreachable says whether err means the shared store cannot serve now. An in-process store (no Pinger: the
// memory store) can never be unreachable: nothing would ever probe it back up. For a remote store, every
// error is an outage (connection refused or reset, timeouts, a closed pool, an epoch change) except:
//   - the store's own typed refusals (kvstore.ErrInvalidArgument, ErrInvalidTier, ErrNoCapacity,
//     ErrLeaseNotLive, ErrNotFound, ErrDigestMismatch, ErrTooManyEndpoints) and a cancelled context;
//   - a Redis error reply, which proves the server answered, unless the reply says it cannot serve now
//     (LOADING, CLUSTERDOWN, MASTERDOWN, TRYAGAIN, READONLY, max clients, OOM, NOREPLICAS).
func (r *Router) unreachable(err error) bool {
	if r.o.Pinger == nil {
		return false
	}
	return storeUnreachable(err)
}

// storeUnreachable is unreachable for a remote store.
func storeUnreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	for _, refusal := range []error{kvstore.ErrInvalidArgument, kvstore.ErrInvalidTier, kvstore.ErrNoCapacity,
		kvstore.ErrLeaseNotLive, kvstore.ErrNotFound, kvstore.ErrDigestMismatch, kvstore.ErrTooManyEndpoints} {
		if errors.Is(err, refusal) {
			return false
		}
	}
	if _, ok := errors.AsType[redis.Error](err); ok {
		return redis.IsLoadingError(err) || redis.IsClusterDownError(err) || redis.IsMasterDownError(err) ||
			redis.IsTryAgainError(err) || redis.IsReadOnlyError(err) || redis.IsMaxClientsError(err) ||
			redis.IsOOMError(err) || redis.IsNoReplicasError(err)
	}
	return true
}

// errStoreRefused is the 500 a client gets when the store refused its reservation for a reason other than
// capacity (a gateway bug, not the client's: the request's cost is always valid).
func errStoreRefused() *openai.Error {
	return openai.Errorf(500, "server_error", "", "store_error", "The reservation store refused the request.")
}
