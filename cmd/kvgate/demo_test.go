package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Issue 18: the README's first request, with `make run`'s own config and `kvgate serve --listen`: the
// banner prints it, and sent twice the second answer comes from the same endpoint with cached tokens (a
// bare "Hello!" is shorter than one block and never could).
func TestDemoFirstRequestHits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway with four simulated engines")
	}
	wd, _ := os.Getwd()
	if err := os.Chdir("../.."); err != nil { // make run runs at the repository root
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	t.Setenv("KVGATE_ADMIN_TOKEN", "")
	body, err := os.ReadFile(demoRequest)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := newServeCmd()
	cmd.SetArgs([]string{"--config", "examples/configs/demo.yaml", "--listen", "127.0.0.1:0"})
	cmd.SetOut(pw)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx); pw.Close() }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("serve did not stop")
		}
	}()
	var banner strings.Builder
	addr := ""
	re := regexp.MustCompile(`listening on http://(127\.0\.0\.1:\d+) with 4 simulated engines`)
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		banner.WriteString(sc.Text() + "\n")
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
		if strings.HasPrefix(sc.Text(), "Metrics:") {
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if addr == "" || !strings.Contains(banner.String(), "-d @"+demoRequest) {
		t.Fatalf("banner:\n%s", banner.String())
	}
	var eps []string
	var cached []int
	for range 2 {
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || r.Usage.PromptTokens < 64 {
			t.Fatalf("%d %v %+v", resp.StatusCode, err, r)
		}
		eps = append(eps, resp.Header.Get("x-kvgate-endpoint"))
		cached = append(cached, r.Usage.PromptTokensDetails.CachedTokens)
	}
	if eps[0] != eps[1] || !strings.HasPrefix(eps[0], "sim-qwen3-") || cached[0] != 0 || cached[1] < 64 {
		t.Fatalf("endpoints %v cached %v", eps, cached)
	}
}
