package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
)

func client(g *Gateway) openai.Client {
	return openai.NewClient(option.WithBaseURL("http://"+g.Addr()+"/v1"), option.WithAPIKey("unused"),
		option.WithMaxRetries(0))
}

func longSystemPrompt(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "Rule %d: answer politely and cite the handbook section %d. ", i, i*7)
	}
	return b.String()
}

// The official client gets answers, streamed and not, and the second turn of a conversation lands on the
// endpoint of the first with cached prompt tokens reported by the engine.
func TestOpenAIClientAndAffinity(t *testing.T) {
	engines := startSims(t, 3, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	waitSubscribed(t, engines, g)
	c := client(g)
	ctx := context.Background()
	sys := longSystemPrompt(40)
	var hdr *http.Response
	first, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen3",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage("How do I reset my password?")},
		MaxTokens: openai.Int(4)}, option.WithResponseInto(&hdr))
	if err != nil {
		t.Fatal(err)
	}
	ep1 := hdr.Header.Get("x-kvgate-endpoint")
	pol := hdr.Header.Get("x-kvgate-policy")
	if ep1 == "" || !strings.HasPrefix(pol, "three-tier@") || len(pol) != len("three-tier@")+12 {
		t.Fatalf("headers: endpoint %q policy %q", ep1, pol)
	}
	if first.Usage.PromptTokens < 400 || len(first.Choices) != 1 {
		t.Fatalf("usage %+v", first.Usage)
	}
	// Second turn: same prefix plus the answer and a new question.
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage("How do I reset my password?"),
		openai.AssistantMessage(first.Choices[0].Message.Content), openai.UserMessage("And my username?")}
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen3", Messages: msgs,
		MaxTokens: openai.Int(5), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}},
		option.WithResponseInto(&hdr))
	var chunks, cached int
	var text strings.Builder
	for stream.Next() {
		ch := stream.Current()
		chunks++
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
		if ch.Usage.PromptTokens > 0 {
			cached = int(ch.Usage.PromptTokensDetails.CachedTokens)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Header.Get("x-kvgate-endpoint"); got != ep1 {
		t.Fatalf("second turn went to %s, first to %s", got, ep1)
	}
	if chunks < 3 || cached < 400 {
		t.Fatalf("chunks %d, cached tokens %d (want the system prompt cached)", chunks, cached)
	}
}

func TestOwnErrors(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "max_body_bytes: 65536\n"))
	base := "http://" + g.Addr()
	cases := []struct {
		name, path, body string
		status           int
		code, param      any
	}{
		{"malformed", "/v1/chat/completions", `{"model":"qwen3","messages":[`, 400, nil, nil},
		{"bad field", "/v1/chat/completions", `{"model":"qwen3","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, 400, nil, "stream"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found", "model"},
		{"too large", "/v1/completions", `{"model":"qwen3","prompt":"` + strings.Repeat("a", 70000) + `"}`, 413, "request_too_large", nil},
		{"bad prompt", "/v1/completions", `{"model":"qwen3","prompt":[1,"x"]}`, 400, nil, "prompt"},
		{"no route", "/v1/audio/speech", `{}`, 404, "not_found", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, _, b := post(t, base+tc.path, tc.body)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   any    `json:"param"`
					Code    any    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil || st != tc.status || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("status %d body %s", st, b)
			}
			if e.Error.Code != tc.code || e.Error.Param != tc.param {
				t.Fatalf("code %v param %v; body %s", e.Error.Code, e.Error.Param, b)
			}
		})
	}
	// An upstream 4xx passes through with the engine's own body.
	st, h, b := post(t, base+"/v1/completions", `{"model":"qwen3","prompt":"hi","max_tokens":99999999}`)
	if st != 400 || h.Get("x-kvgate-endpoint") != "e0" || !strings.Contains(string(b), "max") {
		t.Fatalf("upstream 400: %d %s %v", st, b, h)
	}
	// A multi-MB long-context body is accepted with the default limit (checked on a second gateway).
}

func TestAdminAuthPathVariants(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	base := "http://" + g.Addr()
	paths := []string{"/admin/v1/policies", "//admin/v1/policies", "/admin/../admin/v1/policies",
		"/%61dmin/v1/policies", "/%2561dmin/v1/policies", "/admin/v1/policies/", "/ADMIN/v1/policies",
		"/admin%2fv1%2fpolicies", "/v1/../admin/v1/policies", "/./admin/v1/policies", "/admin", "/admin/",
		"/admin\\v1\\policies", "/admin/v1/route"}
	for _, p := range paths {
		for _, auth := range []string{"", "Bearer wrong", "Bearer admintok2", "admintok"} {
			for _, method := range []string{"GET", "POST", "PUT"} {
				if st := rawStatus(t, g.Addr(), method, p, auth); st != 401 {
					t.Errorf("%s %s with %q: status %d, want 401", method, p, auth, st)
				}
			}
		}
	}
	// With the token the canonical path is served.
	req, _ := http.NewRequest(http.MethodGet, base+"/admin/v1/policies", nil)
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == 401 {
		t.Fatalf("token refused")
	}
	// Client routes are open (no keys configured); health endpoints are open.
	for _, p := range []string{"/v1/models", "/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
	}
}

func TestClientAPIKeys(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "client_api_keys_env: KVGATE_TEST_KEYS\n"))
	base := "http://" + g.Addr()
	body := `{"model":"qwen3","prompt":"hello","max_tokens":1}`
	if st, _, _ := post(t, base+"/v1/completions", body); st != 401 {
		t.Fatalf("no key: %d", st)
	}
	if st, _, _ := post(t, base+"//v1/completions", body); st != 401 {
		t.Fatalf("no key, path variant: %d", st)
	}
	if st, _, _ := post(t, base+"/v1/completions", body, "Authorization", "Bearer ck3"); st != 401 {
		t.Fatalf("bad key: %d", st)
	}
	if st, _, b := post(t, base+"/v1/completions", body, "Authorization", "Bearer ck2"); st != 200 {
		t.Fatalf("good key: %d %s", st, b)
	}
}

// rawStatus sends a request line with the path exactly as written (no client-side cleaning) and returns
// the status code.
func rawStatus(t *testing.T, addr, method, path, auth string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	req := method + " " + path + " HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Length: 0\r\n"
	if auth != "" {
		req += "Authorization: " + auth + "\r\n"
	}
	if _, err := conn.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
