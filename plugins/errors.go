package plugins

import (
	"errors"
	"fmt"
)

// Sentinel errors of the policy host. Wrapped errors carry a "plugins: op" prefix.
var (
	// ErrInvalidModule: Load rejected the module; the error is a *ValidationError with the report.
	ErrInvalidModule = errors.New("plugins: invalid policy module")
	// ErrUnknownVersion: Activate was given a Version that was never loaded.
	ErrUnknownVersion = errors.New("plugins: unknown policy version")
	// ErrVersionDisabled: the version was disabled after missing call deadlines (or a failed instance
	// replacement); load it again under another name only after fixing it.
	ErrVersionDisabled = errors.New("plugins: policy version disabled")
	// ErrVersionInUse: Unload was asked for a version that is active, kept warm for Rollback, or built in.
	ErrVersionInUse = errors.New("plugins: policy version in use")
	// ErrInitFailed: the guest's init rejected the config (or trapped) while an activation was built.
	ErrInitFailed = errors.New("plugins: policy init failed")
	// ErrNoPrevious: Rollback found no active policy to roll back from.
	ErrNoPrevious = errors.New("plugins: nothing to roll back")
	// ErrBadName: a policy or model name is empty, too long or has characters outside [A-Za-z0-9._-].
	ErrBadName = errors.New("plugins: bad name")
	// ErrClosed: the host was closed.
	ErrClosed = errors.New("plugins: host closed")
)

// ValidationError is Load's error for a rejected module; errors.Is(err, ErrInvalidModule) holds.
type ValidationError struct {
	Report *ValidationReport // the full report; Report.Problems says why the module was rejected
}

// Error implements error, listing the report's problems.
func (e *ValidationError) Error() string {
	return fmt.Sprintf("plugins: load %s: %d problem(s): %v", e.Report.Version, len(e.Report.Problems), e.Report.Problems)
}

// Unwrap returns ErrInvalidModule.
func (e *ValidationError) Unwrap() error { return ErrInvalidModule }
