package endpoints

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
)

// TestParseSimulatorDialects: the load gauges the simulator exports in each engine dialect carry that
// engine's metric names, and ParseMetrics reads both; the fourth recognised sample is
// process_start_time_seconds, which both dialects export.
func TestParseSimulatorDialects(t *testing.T) {
	t.Parallel()
	for api, names := range map[string][2]string{sim.APIVLLM: {"vllm:num_requests_running", "sglang:"},
		sim.APISGLang: {"sglang:num_running_reqs", "vllm:num_requests"}} {
		c := sim.DefaultConfig()
		c.Model = "../../../examples/models/qwen3"
		c.ServedModelNames = []string{"qwen3"}
		c.Host = "127.0.0.1"
		c.API = api
		e, err := sim.Start(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		resp, err := http.Get("http://" + e.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page := string(b)
		if m := ParseMetrics(b); !strings.Contains(page, names[0]) || strings.Contains(page, names[1]) || m.Found != 4 || m.StartTime <= 0 {
			t.Fatalf("metrics of the %q dialect: %d load samples found\n%s", api, m.Found, page)
		}
	}
}
