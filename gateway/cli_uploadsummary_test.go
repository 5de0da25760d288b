package gateway

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/admin"
)

// A module rejected before its sample snapshots ran (warm-up trap) says so, instead of "0 of 0 sample
// snapshots answered correctly".
func TestUploadSummaryStoppedBeforeSamples(t *testing.T) {
	var b strings.Builder
	uploadSummary(&b, admin.UploadResponse{Version: "loop@0123456789abcdef", Report: admin.Report{ABIMinor: 0,
		Problems: []string{"warm-up call: trap: wasm error: unreachable"}}})
	want := "rejected loop@0123456789ab\n  0 bytes, ABI v1.0, compiled in 0.000 s\n" +
		"  validation: stopped before the sample snapshots (see the problems)\n" +
		"  problem: warm-up call: trap: wasm error: unreachable\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}
