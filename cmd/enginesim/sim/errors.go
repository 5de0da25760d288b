package sim

import (
	"errors"
	"fmt"
)

// ConfigError is an invalid Config field (flag name as vLLM spells it) and why.
type ConfigError struct {
	// Field is the flag name of the invalid setting ("block-size", "kv-events-config", ...).
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error implements error: "sim: invalid <field>: <reason>".
func (e *ConfigError) Error() string { return fmt.Sprintf("sim: invalid %s: %s", e.Field, e.Reason) }

// RequestError is a bad client request; the HTTP layer answers it with Status in vLLM's error JSON.
type RequestError struct {
	// Status is the HTTP status (400 bad input, 404 unknown model).
	Status int
	// Type is vLLM's error type ("BadRequestError", "NotFoundError").
	Type string
	// Message is the human-readable error, as vLLM words it where vLLM has the same check.
	Message string
}

// Error implements error: "sim: <message>".
func (e *RequestError) Error() string { return "sim: " + e.Message }

func badRequest(format string, args ...any) *RequestError {
	return &RequestError{Status: 400, Type: "BadRequestError", Message: fmt.Sprintf(format, args...)}
}

// ErrClosed is returned by Engine methods after Close.
var ErrClosed = errors.New("sim: engine closed")

// errCancelled ends a request whose client went away.
var errCancelled = errors.New("sim: request cancelled")
