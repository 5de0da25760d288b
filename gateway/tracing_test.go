package gateway

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP traces receiver (POST /v1/traces, protobuf) that keeps every span with its
// resource's service.name.
type otlpReceiver struct {
	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string
}

func (o *otlpReceiver) start(t *testing.T) string {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want POST /v1/traces application/x-protobuf", http.StatusBadRequest)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		o.mu.Lock()
		for _, rs := range req.ResourceSpans {
			svc := ""
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					svc = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					o.spans = append(o.spans, sp)
					o.service = append(o.service, svc)
				}
			}
		}
		o.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/v1/traces"
}

// trace returns the spans of one trace, by name.
func (o *otlpReceiver) trace(traceID []byte) (map[string][]*tracepb.Span, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]*tracepb.Span{}
	var svc []string
	for i, sp := range o.spans {
		if string(sp.TraceId) == string(traceID) {
			out[sp.Name] = append(out[sp.Name], sp)
			svc = append(svc, o.service[i])
		}
	}
	return out, svc
}

func spanAttr(sp *tracepb.Span, key string) string {
	for _, a := range sp.Attributes {
		if a.Key == key {
			if s := a.GetValue().GetStringValue(); s != "" {
				return s
			}
			return fmt.Sprint(a.GetValue().GetIntValue())
		}
	}
	return ""
}

// Issue 17 item 4: with tracing on, a request carrying a client's W3C traceparent becomes a server span
// of that trace (the client's span its parent) with the routing stages, the reservation and the engine call
// as child spans laid inside it; the engine receives a traceparent of the same trace whose parent is the
// upstream span; the spans reach a real OTLP/HTTP receiver as protobuf.
func TestTracesOTLP(t *testing.T) {
	engines := startSims(t, 1, nil)
	var rec recordingProxy
	front := rec.start(t, engines[0].HTTPAddr())
	var recv otlpReceiver
	url := recv.start(t)
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://"+front+"\"}\n",
		fmt.Sprintf("tracing: {endpoint: %q, batch_timeout: 50ms, service_name: kvgate-test}\n", url)))
	traceID, parentID := "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	var resp *http.Response
	c := client(g)
	_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen3", MaxTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("trace me")}},
		option.WithHeader("traceparent", "00-"+traceID+"-"+parentID+"-01"), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := hex.DecodeString(traceID)
	want := []string{"kvgate.request", "route.tokenize", "route.keys", "route.match", "route.snapshot", "route.rank", "route.reserve", "upstream"}
	var spans map[string][]*tracepb.Span
	var svc []string
	if !waitFor(5*time.Second, func() bool {
		spans, svc = recv.trace(tid)
		for _, n := range want {
			if len(spans[n]) != 1 {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("spans of the client's trace: %v", spans)
	}
	root := spans["kvgate.request"][0]
	if hex.EncodeToString(root.ParentSpanId) != parentID || root.Kind != tracepb.Span_SPAN_KIND_SERVER ||
		spanAttr(root, "kvgate.request_id") != resp.Header.Get("X-Request-Id") || spanAttr(root, "kvgate.endpoint") != "e0" ||
		spanAttr(root, "http.response.status_code") != "200" {
		t.Fatalf("request span: parent %x kind %v attrs %v", root.ParentSpanId, root.Kind, root.Attributes)
	}
	for _, s := range svc {
		if s != "kvgate-test" {
			t.Fatalf("service.name %q", s)
		}
	}
	var last uint64
	for _, n := range want[1:] {
		sp := spans[n][0]
		if string(sp.ParentSpanId) != string(root.SpanId) || sp.StartTimeUnixNano < root.StartTimeUnixNano ||
			sp.EndTimeUnixNano > root.EndTimeUnixNano || sp.EndTimeUnixNano < sp.StartTimeUnixNano {
			t.Fatalf("%s: parent %x (want %x), [%d,%d] outside the request's [%d,%d]", n, sp.ParentSpanId, root.SpanId,
				sp.StartTimeUnixNano, sp.EndTimeUnixNano, root.StartTimeUnixNano, root.EndTimeUnixNano)
		}
		if sp.StartTimeUnixNano < last { // stages, reserve and the engine call follow each other
			t.Fatalf("%s starts before the previous stage ended", n)
		}
		last = sp.EndTimeUnixNano
	}
	up := spans["upstream"][0]
	if got, wantTP := rec.hdrs[len(rec.hdrs)-1].Get("Traceparent"), "00-"+traceID+"-"+hex.EncodeToString(up.SpanId)+"-01"; got != wantTP {
		t.Fatalf("engine got traceparent %q, want %q", got, wantTP)
	}
	if spanAttr(up, "kvgate.endpoint") != "e0" || spanAttr(up, "http.response.status_code") != "200" {
		t.Fatalf("upstream span attrs %v", up.Attributes)
	}
}
