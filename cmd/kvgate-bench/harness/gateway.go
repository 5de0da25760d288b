package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/gateway/config"
)

// DefaultAdminToken is the admin bearer token gateways started by the harness get unless
// GatewayOptions.AdminToken says otherwise.
const DefaultAdminToken = "e2e-admin-token"

// GatewayOptions start one `kvgate serve` process.
type GatewayOptions struct {
	// Bin is the kvgate executable.
	Bin string
	// Name labels the gateway (log file <Name>.log, config <Name>.yaml).
	Name string
	// Dir receives the config file and the log.
	Dir string
	// Config is the gateway configuration; Listen is overwritten with a free loopback port and
	// AdminTokenEnv with KVGATE_ADMIN_TOKEN.
	Config config.Config
	// AdminToken is exported as KVGATE_ADMIN_TOKEN (default DefaultAdminToken).
	AdminToken string
	// Env is extra environment (KEY=value).
	Env []string
	// ReadyTimeout bounds the wait for /readyz = 200 (default 30 s).
	ReadyTimeout time.Duration
}

// Gateway is a running kvgate process.
type Gateway struct {
	*Proc
	// Name is GatewayOptions.Name.
	Name string
	// Addr is its listen address, 127.0.0.1:port.
	Addr string
	// ConfigPath is the YAML file it was started with.
	ConfigPath string
	// AdminToken is its admin bearer token.
	AdminToken string
	// Config is the configuration as written (after gateway/config defaults).
	Config *config.Config
}

// EndpointConfig returns the config entry of an enginesim endpoint with its KV-event and replay addresses
// and in-flight limits (0: unlimited).
func EndpointConfig(e *Engine, maxRequests, maxTokens int64) config.Endpoint {
	return config.Endpoint{ID: e.ID, Engine: config.EngineSim, URL: e.URL(), KVEvents: e.EventsAddr,
		KVReplay: e.ReplayAddr, MaxInflightRequests: maxRequests, MaxInflightTokens: maxTokens}
}

// MarshalConfig renders c as YAML (gateway/config's own yaml tags, durations as Go duration strings) and
// checks that config.Parse accepts it, so a harness-written file is always one kvgate serve can read.
func MarshalConfig(c *config.Config) ([]byte, *config.Config, error) {
	b, err := yaml.Marshal(c)
	if err != nil {
		return nil, nil, fmt.Errorf("harness: config: %w", err)
	}
	parsed, err := config.Parse(b)
	if err != nil {
		return nil, nil, fmt.Errorf("harness: generated config rejected: %w\n%s", err, b)
	}
	return b, parsed, nil
}

// StartGateway writes the config (on a free port) and starts `kvgate serve --config FILE`, retrying on a
// port taken in between, and waits until GET /readyz answers 200.
func StartGateway(ctx context.Context, o GatewayOptions) (*Gateway, error) {
	if o.AdminToken == "" {
		o.AdminToken = DefaultAdminToken
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	var lastErr error
	for range 3 {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		c := o.Config
		c.Listen = "127.0.0.1:" + strconv.Itoa(port)
		c.AdminTokenEnv = "KVGATE_ADMIN_TOKEN"
		b, parsed, err := MarshalConfig(&c)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(o.Dir, o.Name+".yaml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return nil, err
		}
		env := append([]string{"KVGATE_ADMIN_TOKEN=" + o.AdminToken}, o.Env...)
		p, err := StartProc("gateway "+o.Name, filepath.Join(o.Dir, o.Name+".log"), o.Bin,
			[]string{"serve", "--config", path}, env)
		if err != nil {
			return nil, err
		}
		g := &Gateway{Proc: p, Name: o.Name, Addr: c.Listen, ConfigPath: path, AdminToken: o.AdminToken, Config: parsed}
		lastErr = g.waitReady(ctx, o.ReadyTimeout)
		if lastErr == nil {
			return g, nil
		}
		p.Kill()
		if !strings.Contains(p.Log(), "address already in use") {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

func (g *Gateway) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		if done, err := g.Exited(); done {
			return fmt.Errorf("harness: %s exited during start-up (%v):\n%s", g.Proc.Name, err, g.Tail(40))
		}
		rctx, rc := context.WithTimeout(ctx, time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, g.URL()+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				rc()
				return nil
			}
			last = fmt.Sprintf("/readyz %d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		rc()
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: %s not ready (%s):\n%s", g.Proc.Name, last, g.Tail(40))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URL is the gateway's base URL, http://127.0.0.1:port.
func (g *Gateway) URL() string { return "http://" + g.Addr }

// Metrics reads and parses the gateway's /metrics page.
func (g *Gateway) Metrics(ctx context.Context) (Samples, error) {
	return ScrapeMetrics(ctx, g.URL()+"/metrics")
}

// Ready returns GET /readyz's status and decoded body (with the admin token, so the details are in it).
func (g *Gateway) Ready(ctx context.Context) (int, map[string]any, error) {
	var out map[string]any
	st, err := g.do(ctx, http.MethodGet, "/readyz", nil, true, &out) // details need the admin token
	return st, out, err
}

// APIError is a non-2xx answer of the gateway.
type APIError struct {
	Status int    // HTTP status code
	Body   string // response body as received (OpenAI-shaped error JSON)
}

// Error returns "harness: status N: <body>".
func (e *APIError) Error() string { return fmt.Sprintf("harness: status %d: %s", e.Status, e.Body) }

// do sends a request (admin bearer token when auth) and decodes a 2xx JSON answer into out.
func (g *Gateway) do(ctx context.Context, method, path string, body []byte, auth bool, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, g.URL()+path, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	if auth {
		req.Header.Set("Authorization", "Bearer "+g.AdminToken)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 && path != "/readyz" {
		return resp.StatusCode, &APIError{Status: resp.StatusCode, Body: string(b)}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("harness: %s %s: %w: %s", method, path, err, b)
		}
	}
	return resp.StatusCode, nil
}

// Explain calls POST /admin/v1/route with a chat or completions body: the routing decision without
// forwarding (prompt tokens, blocks, per-endpoint match and load, ranking, chosen endpoint).
func (g *Gateway) Explain(ctx context.Context, body []byte) (gateway.AdminExplainResponse, error) {
	var out gateway.AdminExplainResponse
	_, err := g.do(ctx, http.MethodPost, "/admin/v1/route", body, true, &out)
	return out, err
}

// UploadPolicy PUTs a Wasm module as policy name and returns the gateway's validation answer.
func (g *Gateway) UploadPolicy(ctx context.Context, name string, wasm []byte) (gateway.AdminUploadResponse, error) {
	var out gateway.AdminUploadResponse
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, g.URL()+"/admin/v1/policies/"+name, bytes.NewReader(wasm))
	if err != nil {
		return out, err
	}
	req.Header.Set("Authorization", "Bearer "+g.AdminToken)
	req.Header.Set("Content-Type", "application/wasm")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return out, &APIError{Status: resp.StatusCode, Body: string(b)}
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return out, fmt.Errorf("harness: upload: %w: %s", err, b)
	}
	if !out.Accepted {
		return out, errors.New("harness: upload not accepted: " + string(b))
	}
	return out, nil
}

// ActivatePolicy activates version (name@sha256 or a unique prefix of ≥ 8 hex digits) for model with the
// given JSON config (nil: {}).
func (g *Gateway) ActivatePolicy(ctx context.Context, model, version string, configJSON []byte) error {
	if configJSON == nil {
		configJSON = []byte("{}")
	}
	body, _ := json.Marshal(gateway.AdminActivateRequest{Model: model, Version: version, Config: configJSON})
	_, err := g.do(ctx, http.MethodPost, "/admin/v1/policies/activate", body, true, nil)
	return err
}

// Policies returns GET /admin/v1/policies.
func (g *Gateway) Policies(ctx context.Context) (gateway.AdminListResponse, error) {
	var out gateway.AdminListResponse
	_, err := g.do(ctx, http.MethodGet, "/admin/v1/policies", nil, true, &out)
	return out, err
}
