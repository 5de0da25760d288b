package server

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// LogHandler is slog's JSON handler (durations written in seconds, as floats) that also lets the server
// write its access-log lines ("msg":"request", one per request) with a hand-rolled encoder: the same
// fields, order and format as the JSON handler's, without its per-float json.Marshal (see RATIONALE.md
// "The access log's encoder"). The fast path applies only to a logger built directly on a *LogHandler;
// a logger derived with With or WithGroup goes through slog as before. Create with NewLogHandler.
type LogHandler struct {
	slog.Handler // the JSON handler, writing to w
	w            *lockedWriter
	level        slog.Leveler
}

// lockedWriter serializes the JSON handler's records and the access lines written beside it (one Write
// per line either way).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// NewLogHandler returns a JSON handler on w for records at level or above (nil: info), with every
// duration attribute written in seconds (a float), never slog's default nanoseconds.
func NewLogHandler(w io.Writer, level slog.Leveler) *LogHandler {
	if level == nil {
		level = slog.LevelInfo
	}
	lw := &lockedWriter{w: w}
	return &LogHandler{Handler: slog.NewJSONHandler(lw, &slog.HandlerOptions{Level: level, ReplaceAttr: SecondsAttr}),
		w: lw, level: level}
}

// SecondsAttr is a slog ReplaceAttr that writes a duration attribute in seconds (a float).
func SecondsAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.Float64Value(a.Value.Duration().Seconds())
	}
	return a
}

// accessLine is one access-log line's fields, in the order they are written.
type accessLine struct {
	id, model, endpoint, policy string
	status                      int
	stream                      bool
	prompt, cached, completion  int64
	ttft, itl                   float64 // seconds; written only when > 0
	duration                    float64 // seconds
	retries                     int
}

var accessBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeAccess writes a's line to l when l's logger is a *LogHandler without derived attributes (it says
// whether it did; otherwise the caller logs through slog).
func writeAccess(l *slog.Logger, now time.Time, a *accessLine) bool {
	h, ok := l.Handler().(*LogHandler)
	if !ok {
		return false
	}
	if !h.Enabled(context.Background(), slog.LevelInfo) {
		return true
	}
	bp := accessBufs.Get().(*[]byte)
	b := (*bp)[:0]
	b = append(b, `{"time":"`...)
	b = now.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"request","request_id":`...)
	b = appendJSONString(b, a.id)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, a.model)
	b = append(b, `,"endpoint_id":`...)
	b = appendJSONString(b, a.endpoint)
	b = append(b, `,"policy":`...)
	b = appendJSONString(b, a.policy)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(a.status), 10)
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, a.stream)
	b = append(b, `,"prompt_tokens":`...)
	b = strconv.AppendInt(b, a.prompt, 10)
	b = append(b, `,"cached_tokens":`...)
	b = strconv.AppendInt(b, a.cached, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, a.completion, 10)
	if a.ttft > 0 {
		b = append(b, `,"ttft_seconds":`...)
		b = appendJSONFloat(b, a.ttft)
	}
	if a.itl > 0 {
		b = append(b, `,"itl_seconds":`...)
		b = appendJSONFloat(b, a.itl)
	}
	b = append(b, `,"duration_seconds":`...)
	b = appendJSONFloat(b, a.duration)
	b = append(b, `,"retries":`...)
	b = strconv.AppendInt(b, int64(a.retries), 10)
	b = append(b, "}\n"...)
	h.w.Write(b)
	*bp = b
	accessBufs.Put(bp)
	return true
}

// appendJSONFloat appends f as encoding/json writes a float64 (what slog's JSON handler calls): the
// shortest representation, in exponent form below 1e-6 and from 1e21 on, with a two-digit exponent
// written without its leading zero ("1e-07").
func appendJSONFloat(b []byte, f float64) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return append(b, `"`+strconv.FormatFloat(f, 'g', -1, 64)+`"`...) // not produced by end's durations
	}
	abs := math.Abs(f)
	fmt := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		fmt = 'e'
	}
	n := len(b)
	b = strconv.AppendFloat(b, f, fmt, -1, 64)
	if fmt == 'e' {
		// clean up e-09 to e-9
		if m := len(b) - n; m >= 4 && b[len(b)-4] == 'e' && b[len(b)-3] == '-' && b[len(b)-2] == '0' {
			b[len(b)-2] = b[len(b)-1]
			b = b[:len(b)-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as slog's JSON handler writes strings: ", \ and control characters
// escaped (\n, \r, \t, else \u00XX), invalid UTF-8 as U+FFFD (unescaped), U+2028 and U+2029 escaped, HTML
// characters kept.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, "\ufffd"...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
