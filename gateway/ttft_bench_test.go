package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
)

// ttftCalibration is testdata/ttft/calibration.json: the engine's render + tokenize cost measured with
// Jinja and HF's Rust tokenizer for each benchmark conversation.
type ttftCalibration struct {
	Sizes []struct {
		Name     string  `json:"name"`
		Pairs    int     `json:"pairs"`
		Tokens   int     `json:"tokens"`
		RenderMS float64 `json:"render_ms"`
		EncodeMS float64 `json:"encode_ms"`
	} `json:"sizes"`
}

// benchConversation is testdata/ttft/conversation.py's messages(pairs), as a JSON array.
func benchConversation(pairs int) string {
	sentence := func(i int) string {
		return fmt.Sprintf("The committee reviewed section %d of the maintenance log and noted that valve %d was inspected, "+
			"cleaned and resealed before the afternoon shift. ", i, i%17)
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", "You are the maintenance assistant of a water treatment plant. Answer from the log."}}
	for k := range pairs {
		var u, a strings.Builder
		fmt.Fprintf(&u, "Question %d: ", k)
		for j := range 3 {
			u.WriteString(sentence(3*k + j))
			a.WriteString(sentence(3*k + j + 1000))
		}
		msgs = append(msgs, msg{"user", u.String()}, msg{"assistant", a.String()})
	}
	msgs = append(msgs, msg{"user", "Summarise what was done to valve 3."})
	b, _ := json.Marshal(msgs)
	return string(b)
}

// BenchmarkChatTTFT measures the time to first token of a streamed chat through the gateway to a vLLM-
// dialect simulated engine, with chat_token_ids off (the engine renders and tokenizes: it waits the
// calibrated Jinja + HF tokenizer time of testdata/ttft/calibration.json) and with token IDs
// (kv_transfer_params: it does not). Prefill follows the simulator's H100 defaults in real time
// (TimeScale 1). cold: a cache_salt per request, so the whole prompt is prefilled; warm: the conversation
// is in the engine's prefix cache (a follow-up turn), so only the last block is. Reported: ttft-ms (median
// of the iterations); the gateway's own render + tokenize is in both.
//
//	go test -run '^$' -bench ChatTTFT -benchtime 5x ./gateway
func BenchmarkChatTTFT(b *testing.B) {
	raw, err := os.ReadFile("testdata/ttft/calibration.json")
	if err != nil {
		b.Fatal(err)
	}
	var cal ttftCalibration
	if err := json.Unmarshal(raw, &cal); err != nil {
		b.Fatal(err)
	}
	enc, err := testEncoder("")
	if err != nil {
		b.Fatal(err)
	}
	for _, sz := range cal.Sizes {
		msgs := benchConversation(sz.Pairs)
		_, ids, err := enc.EncodeChat([]byte(`{"messages":` + msgs + `}`))
		if err != nil {
			b.Fatal(err)
		}
		if len(ids) != sz.Tokens { // the gateway's tokens equal HF's count for the same Jinja render
			b.Fatalf("%s: gateway tokenizes the conversation to %d tokens, HF tokenizers to %d", sz.Name, len(ids), sz.Tokens)
		}
		perToken := time.Duration((sz.RenderMS + sz.EncodeMS) * float64(time.Millisecond) / float64(sz.Tokens))
		for _, cache := range []string{"cold", "warm"} {
			for _, mode := range []string{"off", "kv_transfer_params"} {
				b.Run(mode+"/"+cache+"/"+sz.Name, func(b *testing.B) {
					e := startSims(b, 1, func(c *sim.Config) {
						c.TimeScale, c.RenderTokenizePerToken = 1, perToken
						c.KVEvents = sim.KVEventsConfig{Publisher: "null"}
						c.NumGPUBlocks = 20000
					})[0]
					g := startGateway(b, gwYAML(fmt.Sprintf("      - {id: e0, engine: vllm, url: \"http://%s\", chat_token_ids: %s}\n",
						e.HTTPAddr(), mode), "verify_token_ids_every: 0\n"))
					url := "http://" + g.Addr() + "/v1/chat/completions"
					salt := func(i int) string {
						if cache == "warm" {
							return "warm" // every request hits the conversation the first one cached
						}
						return fmt.Sprintf("run-%d-%d", i, time.Now().UnixNano())
					}
					if cache == "warm" {
						resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"qwen3","max_tokens":1,"cache_salt":"warm","messages":`+msgs+`}`))
						if err != nil || resp.StatusCode != 200 {
							b.Fatalf("warm-up: %v", err)
						}
						resp.Body.Close()
					}
					warmups := e.PromptsTokenized()
					var ttfts []float64
					b.ResetTimer()
					for i := range b.N {
						body := fmt.Sprintf(`{"model":"qwen3","stream":true,"max_tokens":1,"cache_salt":%q,"messages":%s}`, salt(i), msgs)
						start := time.Now()
						resp, err := http.Post(url, "application/json", strings.NewReader(body))
						if err != nil {
							b.Fatal(err)
						}
						rd := bufio.NewReader(resp.Body)
						line, err := rd.ReadString('\n')
						ttft := time.Since(start)
						if err != nil || !strings.HasPrefix(line, "data: ") || resp.StatusCode != 200 {
							b.Fatalf("status %d first line %q %v", resp.StatusCode, line, err)
						}
						resp.Body.Close()
						ttfts = append(ttfts, float64(ttft.Microseconds())/1000)
					}
					b.StopTimer()
					slices.Sort(ttfts)
					b.ReportMetric(ttfts[len(ttfts)/2], "ttft-ms")
					b.ReportMetric(float64(sz.Tokens), "prompt-tokens")
					want := int64(0)
					if mode == "off" {
						want = int64(b.N)
					}
					if n := e.PromptsTokenized() - warmups; n != want {
						b.Fatalf("engine tokenized %d prompts, want %d", n, want)
					}
				})
			}
		}
	}
}
