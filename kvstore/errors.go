package kvstore

import "errors"

// Sentinel errors of the store. Backends wrap them with "kvstore: op" context; match with errors.Is.
var (
	// ErrInvalidTier is returned by Add and Remove for a Tier other than TierGPU or TierCPU.
	ErrInvalidTier = errors.New("kvstore: invalid tier")
	// ErrInvalidArgument is returned for an empty model, endpoint, lease or blob name, a negative cost or a
	// non-positive TTL.
	ErrInvalidArgument = errors.New("kvstore: invalid argument")
	// ErrLeaseNotLive is returned by Renew when the lease has expired or was released.
	ErrLeaseNotLive = errors.New("kvstore: lease expired or released")
	// ErrNotFound is returned by GetBlob and GetActive for a name or model with nothing stored.
	ErrNotFound = errors.New("kvstore: not found")
	// ErrDigestMismatch is returned by PutBlob when the data's SHA-256 is not the given hex digest.
	ErrDigestMismatch = errors.New("kvstore: sha256 digest mismatch")
	// ErrFenced is returned by a fenced index write (Fencer.Fenced) whose fencing token is not the one
	// recorded for its scope (a stale lease holder's write, refused before anything is written), and by
	// RaiseFence for a token older than the recorded one.
	ErrFenced = errors.New("kvstore: write fenced off: a newer lease holder has written")
	// ErrTooManyEndpoints is returned by the memory index once it has numbered 65,535 distinct endpoints.
	ErrTooManyEndpoints = errors.New("kvstore: too many endpoints")
)
