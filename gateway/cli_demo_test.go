package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// Issue 18: the README's first request, with `make run`'s own config and `kvgate serve --listen`: the
// banner prints it, and sent twice the second answer comes from the same endpoint with cached tokens (a
// bare "Hello!" is shorter than one block and never could).
func TestDemoFirstRequestHits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway with four simulated engines")
	}
	t.Chdir("..") // make run runs at the repository root; restored after serve stops
	t.Setenv("KVGATE_ADMIN_TOKEN", "")
	body, err := os.ReadFile(demoRequest)
	if err != nil {
		t.Fatal(err)
	}
	addr, banner := runServe(t, func(ctx context.Context, out io.Writer) error {
		cmd := newServeCmd()
		cmd.SetArgs([]string{"--config", "examples/configs/demo.yaml", "--listen", "127.0.0.1:0"})
		cmd.SetOut(out)
		return cmd.ExecuteContext(ctx)
	})
	if !regexp.MustCompile(`listening on http://127\.0\.0\.1:\d+ with 4 simulated engines`).MatchString(banner) ||
		!strings.Contains(banner, "-d @"+demoRequest) {
		t.Fatalf("banner:\n%s", banner)
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
