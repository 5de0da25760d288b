package gateway

import (
	"bufio"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

var listeningRE = regexp.MustCompile(`listening on http://(\S+)`)

// runServe runs a serve command (serve itself, or a cobra command's ExecuteContext) in the background
// until the test ends, reads what it prints up to the "Metrics:" line, and returns the address of its
// "listening on http://ADDR" line and that banner. At cleanup the command's context is cancelled and it
// must return nil within 15 s.
func runServe(t *testing.T, run func(ctx context.Context, out io.Writer) error) (addr, banner string) {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, pw); pw.Close() }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("serve did not stop")
		}
	})
	var b strings.Builder
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
		if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil && addr == "" {
			addr = m[1]
		}
		if strings.HasPrefix(sc.Text(), "Metrics:") {
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if addr == "" {
		t.Fatalf("no listening line from serve:\n%s", b.String())
	}
	return addr, b.String()
}
