package sim

import (
	"fmt"
	"sync"
	"time"
)

// Faults are failures the simulator injects for tests, armed by flags at start or by POST /sim/faults.
// Request faults apply to the completion endpoints only (/v1/chat/completions, /v1/completions), to the
// next FailCount requests (-1 = every request until disarmed). JSON field names are the ones /sim/faults
// takes.
type Faults struct {
	// FailStatus is the HTTP status (500 or 503) answered instead of serving; 0 = off.
	FailStatus int `json:"fail_status"`
	// FailCount is how many requests FailStatus applies to (-1 = all; 0 with FailStatus set means 1).
	FailCount int `json:"fail_count"`
	// CloseAfterChunks closes the connection of a streaming response after that many SSE chunks, without
	// the terminating chunk ([DONE] is never sent); a non-streaming response is closed before its body.
	// 0 = off.
	CloseAfterChunks int `json:"close_after_chunks"`
	// CloseCount is how many requests CloseAfterChunks applies to (-1 = all; 0 means 1).
	CloseCount int `json:"close_count"`
	// StallBeforeHeaders delays the response headers of the next StallCount requests (a hung engine);
	// the request is not scheduled until the stall ends. Given as a Go duration string ("2s") in JSON.
	StallBeforeHeaders Duration `json:"stall_before_headers"`
	// StallCount is how many requests StallBeforeHeaders applies to (-1 = all; 0 means 1).
	StallCount int `json:"stall_count"`
	// DropEventBatches drops that many upcoming KV-event batches on the PUB socket (a sequence gap); the
	// batches stay in the replay buffer, as a network loss would leave them.
	DropEventBatches int `json:"drop_event_batches"`
	// RestartEventSeq restarts the event sequence at 0 and empties the KV cache and replay buffer, as a
	// restarted engine would (no AllBlocksCleared is sent). It is an action: it fires once when set.
	RestartEventSeq bool `json:"restart_event_seq"`
	// TemplateDrift makes the engine render chat prompts with a changed template (one more newline after
	// the prompt's first line) for generation and /tokenize alike, while it stays set: the engine's tokens
	// no longer match a gateway that renders with the model's own template. Requests that arrive with
	// token IDs are unaffected, as on a real engine.
	TemplateDrift bool `json:"template_drift"`
}

// Duration is a time.Duration that JSON-encodes as a Go duration string ("1.5s").
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(fmt.Sprintf("%q", time.Duration(d).String())), nil
}

// UnmarshalJSON accepts a Go duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if _, err := fmt.Sscanf(string(b), "%q", &s); err != nil {
			return fmt.Errorf("sim: bad duration %s", b)
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("sim: bad duration %s: %w", b, err)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if _, err := fmt.Sscanf(string(b), "%g", &secs); err != nil {
		return fmt.Errorf("sim: bad duration %s", b)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

func (f *Faults) validate() error {
	bad := func(reason string) error { return &ConfigError{Field: "faults", Reason: reason} }
	switch {
	case f.FailStatus != 0 && (f.FailStatus < 400 || f.FailStatus > 599):
		return bad(fmt.Sprintf("fail_status %d is not an HTTP error status", f.FailStatus))
	case f.FailCount < -1 || f.CloseCount < -1 || f.StallCount < -1:
		return bad("counts must be >= -1")
	case f.CloseAfterChunks < 0 || f.DropEventBatches < 0 || f.StallBeforeHeaders < 0:
		return bad("values must not be negative")
	}
	return nil
}

// faultState holds the armed faults and counts down their uses. Safe for concurrent use.
type faultState struct {
	mu sync.Mutex
	f  Faults
}

func (s *faultState) set(f Faults) {
	if f.FailStatus != 0 && f.FailCount == 0 {
		f.FailCount = 1
	}
	if f.CloseAfterChunks != 0 && f.CloseCount == 0 {
		f.CloseCount = 1
	}
	if f.StallBeforeHeaders != 0 && f.StallCount == 0 {
		f.StallCount = 1
	}
	s.mu.Lock()
	s.f = f
	s.mu.Unlock()
}

func (s *faultState) get() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f
}

// take consumes one use of a counted fault; it reports whether the fault applies.
func take(count *int) bool {
	switch {
	case *count == -1:
		return true
	case *count > 0:
		*count--
		return true
	}
	return false
}

// requestFaults are the faults drawn for one request.
type requestFaults struct {
	failStatus       int
	closeAfterChunks int
	stall            time.Duration
}

func (s *faultState) draw() requestFaults {
	s.mu.Lock()
	defer s.mu.Unlock()
	var r requestFaults
	if s.f.FailStatus != 0 && take(&s.f.FailCount) {
		r.failStatus = s.f.FailStatus
		if s.f.FailCount == 0 {
			s.f.FailStatus = 0
		}
	}
	if s.f.CloseAfterChunks != 0 && take(&s.f.CloseCount) {
		r.closeAfterChunks = s.f.CloseAfterChunks
		if s.f.CloseCount == 0 {
			s.f.CloseAfterChunks = 0
		}
	}
	if s.f.StallBeforeHeaders != 0 && take(&s.f.StallCount) {
		r.stall = time.Duration(s.f.StallBeforeHeaders)
		if s.f.StallCount == 0 {
			s.f.StallBeforeHeaders = 0
		}
	}
	return r
}

// takeEventDrop consumes one armed event-batch drop; it reports whether the next batch is dropped.
func (s *faultState) takeEventDrop() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f.DropEventBatches > 0 {
		s.f.DropEventBatches--
		return true
	}
	return false
}
