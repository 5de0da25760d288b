package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Issue 18: the new routes (GET /v1/models/{id}, POST /v1/responses, /v1/embeddings, /tokenize, /detokenize)
// sit behind the same auth decision as the others, taken on the headers before the body is read: without a
// client key a 60 MB upload is answered 401 and the connection closed. With a key, /tokenize takes bodies up
// to max_body_bytes (not the 64 KiB of body-less routes), and bad requests get OpenAI-shaped errors.
func TestSurfaceAuthBeforeBody(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "client_api_keys_env: KVGATE_TEST_KEYS\n"))
	addr := g.Addr()
	for _, path := range []string{"/v1/responses", "/v1/embeddings", "/tokenize", "/detokenize", "/v1/models/qwen3"} {
		c := dial(t, addr)
		method := "POST"
		if strings.HasPrefix(path, "/v1/models") {
			method = "GET"
		}
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 62914560\r\n\r\n{\"model\":", method, path)
		if r, closed := closedWithin(c, 10*time.Second); !strings.HasPrefix(r, "HTTP/1.1 401") || !closed {
			t.Fatalf("%s %s without a key: closed=%v %q", method, path, closed, r)
		}
	}
	key := []string{"Authorization", "Bearer ck1"}
	big := strings.Repeat("lantern meadow ", 20000) // 300 kB: over the 64 KiB limit of body-less routes
	st, _, body := post(t, "http://"+addr+"/tokenize", `{"model":"qwen3","prompt":"`+big+`"}`, key...)
	var tok struct {
		Count int `json:"count"`
	}
	if st != 200 || json.Unmarshal(body, &tok) != nil || tok.Count < 20000 {
		t.Fatalf("large /tokenize with a key: %d %.200s", st, body)
	}
	for _, tc := range []struct {
		path, body string
		status     int
		param      string
		code       string
	}{
		{"/v1/responses", `{"model":"qwen3","input":`, 400, "", ""},
		{"/v1/responses", `{"model":"nope","input":"hi"}`, 404, "model", "model_not_found"},
		{"/v1/responses", `{"model":"qwen3"}`, 400, "input", ""},
		{"/v1/responses", `{"model":"qwen3","input":[{"role":"wizard","content":"x"}]}`, 400, "input", ""},
		{"/v1/responses", `{"model":"qwen3","input":"hi","max_output_tokens":-1}`, 400, "max_output_tokens", ""},
		{"/v1/embeddings", `{"model":"qwen3","input":[]}`, 400, "input", ""},
		{"/v1/embeddings", `{"model":"qwen3","input":{"a":1}}`, 400, "input", ""},
		{"/tokenize", `{"model":"qwen3"}`, 400, "prompt", ""},
		{"/tokenize", `{"model":"qwen3","messages":[{"role":"user","content":"x"}],"chat_template":"{{ 1 }}"}`, 400, "chat_template", ""},
		{"/detokenize", `{"model":"qwen3","tokens":[-1]}`, 400, "tokens", ""},
		{"/detokenize", `{"model":"qwen3-lora","tokens":"x"}`, 400, "tokens", ""},
	} {
		st, _, body := post(t, "http://"+addr+tc.path, tc.body, key...)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Param   any    `json:"param"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || st != tc.status || e.Error.Message == "" {
			t.Fatalf("%s %s: %d %s", tc.path, tc.body, st, body)
		}
		if (tc.param == "" && e.Error.Param != nil) || (tc.param != "" && e.Error.Param != tc.param) ||
			(tc.code != "" && e.Error.Code != tc.code) {
			t.Fatalf("%s %s: param %v code %v, want %q %q", tc.path, tc.body, e.Error.Param, e.Error.Code, tc.param, tc.code)
		}
	}
	// A LoRA adapter's model object names its base model.
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/models/qwen3-lora", nil)
	req.Header.Set("Authorization", "Bearer ck2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		ID, Object, Parent string
	}
	json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if resp.StatusCode != 200 || m.ID != "qwen3-lora" || m.Object != "model" || m.Parent != "qwen3" {
		t.Fatalf("LoRA model object: %d %+v", resp.StatusCode, m)
	}
}
