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
