package route

import "errors"

// The router's errors. Plan and Reserve wrap them with context; match with errors.Is / errors.As. The
// server maps each to its HTTP answer (gateway/internal/server routeError), so the router never speaks HTTP.
var (
	// ErrNoHealthy: no healthy endpoint serves the model, or every candidate was tried (503).
	ErrNoHealthy = errors.New("route: no healthy endpoint")
	// ErrQueueTimeout: every candidate stayed at capacity for the model's queue timeout (429).
	ErrQueueTimeout = errors.New("route: every endpoint at capacity for the queue timeout")
	// ErrStoreRefused: the reservations refused for a reason other than capacity (500: a gateway bug, not the
	// client's: the request's cost is always valid). The store's error is wrapped beside it.
	ErrStoreRefused = errors.New("route: the reservation store refused the request")
)

// RequestError says the request cannot be routed as it is (400): it cannot be tokenized, its prompt is too
// long, or no endpoint runs that many sequences at once.
type RequestError struct {
	// Param is the offending request field ("messages", "prompt", or a JSON path into messages).
	Param string
	// Code is the OpenAI error code ("" for none; "prompt_too_long", "batch_too_large").
	Code string
	// Message is worded for the client (no internal package prefixes).
	Message string
}

func (e *RequestError) Error() string { return e.Message }
