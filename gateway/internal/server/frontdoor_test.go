package server

import (
	"strings"
	"testing"
)

// The stream scanner finds its markers wherever the reads split them.
func TestStreamScanSplitMarkers(t *testing.T) {
	for _, tc := range []struct {
		stream                string
		done, finish, errored bool
	}{
		{"data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n", true, false, false},
		{"data: {\"choices\":[{\"finish_reason\":\"stop\"}]}\n\n", false, true, false},
		{"data: {\"choices\":[{\"finish_reason\": \"length\"}]}\n\n", false, true, false},
		{"data: {\"choices\":[]}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n", false, false, true},
		{"data: {\"object\":\"error\",\"message\":\"boom\"}\n\n", false, false, true},
		{"data: {\"choices\":[{\"finish_reason\":null}]}\n\n", false, false, false},
	} {
		for step := 1; step <= len(tc.stream); step++ {
			var s streamScan
			for i := 0; i < len(tc.stream); i += step {
				s.scan([]byte(tc.stream[i:min(i+step, len(tc.stream))]))
			}
			if s.sawDone != tc.done || s.sawFinish != tc.finish || s.sawError != tc.errored {
				t.Fatalf("%q in reads of %d: done %v finish %v error %v", strings.TrimSpace(tc.stream), step, s.sawDone, s.sawFinish, s.sawError)
			}
		}
	}
}

// framingError refuses what RFC 9112 calls ambiguous, and nothing else.
func TestFramingError(t *testing.T) {
	for raw, bad := range map[string]bool{
		"Host: x\r\nContent-Length: 5\r\n\r\n":                                        false,
		"Host: x\r\nTransfer-Encoding: chunked\r\n\r\n":                               false,
		"Host: x\r\ntransfer-encoding:  Chunked \r\n\r\n":                             false,
		"Host: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n":          true,
		"Host: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n":                   true,
		"Host: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n":                   true,
		"Host: x\r\nTransfer-Encoding: chunked\t\r\n\r\n":                             true,
		"Host: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n":                     true,
		"Host: x\r\nTransfer-Encoding: identity\r\n\r\n":                              true,
		"Host: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n": true,
	} {
		if got := framingError([]byte(raw)) != ""; got != bad {
			t.Errorf("%q: refused %v, want %v", raw, got, bad)
		}
	}
}

// FuzzFramingError: framingError never panics, refuses every header block with both Content-Length and
// Transfer-Encoding or with several Content-Length lines, and accepts one plain Content-Length.
func FuzzFramingError(f *testing.F) {
	f.Add("Content-Length: 5\r\n")
	f.Add("Transfer-Encoding: chunked\r\n")
	f.Add("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n")
	f.Add("transfer-encoding: chunked, identity\r\ncontent-length: 1\r\n")
	f.Add("Transfer-Encoding: chunked\t\r\n")
	f.Fuzz(func(t *testing.T, raw string) {
		msg := framingError([]byte(raw))
		var cl, te int
		for _, line := range strings.Split(raw, "\n") {
			name, _, ok := strings.Cut(strings.TrimSuffix(line, "\r"), ":")
			if !ok || name == "" {
				continue
			}
			switch strings.ToLower(name) {
			case "content-length":
				cl++
			case "transfer-encoding":
				te++
			}
		}
		if (cl > 0 && te > 0 || cl > 1) && msg == "" {
			t.Fatalf("%q accepted (CL %d, TE %d)", raw, cl, te)
		}
		if cl <= 1 && te == 0 && msg != "" {
			t.Fatalf("%q refused: %s", raw, msg)
		}
	})
}

// FuzzStreamScan: the markers found do not depend on how the stream is split into reads.
func FuzzStreamScan(f *testing.F) {
	f.Add("data: {\"choices\":[{\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", uint8(7))
	f.Add("data: {\"error\":{\"message\":\"x\"}}\n\n", uint8(3))
	f.Add("data: {\"object\":\"error\"}\n\n", uint8(1))
	f.Fuzz(func(t *testing.T, stream string, step uint8) {
		var whole, split streamScan
		whole.scan([]byte(stream))
		n := int(step%64) + 1
		for i := 0; i < len(stream); i += n {
			split.scan([]byte(stream[i:min(i+n, len(stream))]))
		}
		if whole.sawDone != split.sawDone || whole.sawFinish != split.sawFinish || whole.sawError != split.sawError {
			t.Fatalf("%q in reads of %d: whole %+v split %+v", stream, n, whole, split)
		}
	})
}
