package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// testCA is a certificate authority made in the test; issue writes certificates it signs.
type testCA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	dir    string
	caFile string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvgate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, dir: t.TempDir()}
	ca.caFile = filepath.Join(ca.dir, "ca.pem")
	os.WriteFile(ca.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	return ca
}

// issue writes name.pem and name-key.pem: a certificate for 127.0.0.1 (server and client use) with serial.
func (ca *testCA) issue(t *testing.T, name string, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	// The key first, then the certificate: a reload between the two writes fails and keeps the old one.
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	return certFile, keyFile
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// startGatewayEnv is startGateway with more environment variables; it returns Start's error instead of
// failing.
func startGatewayEnv(t *testing.T, yaml string, extra map[string]string) (*Gateway, error) {
	t.Helper()
	return startGatewayWith(t, yaml, extra, slog.New(slog.NewJSONHandler(io.Discard, nil)))
}

// Issue 17 item 5: an https engine that requires a client certificate from the test's CA and its own API
// key (as vLLM --api-key): with upstream_tls (ca_file, client certificate) and api_key_env the gateway's
// requests get through carrying the engine's key, never the client's; without the client certificate the
// engine refuses the handshake and the client gets no answer of the engine's.
func TestUpstreamMTLSAndAPIKey(t *testing.T) {
	ca := newTestCA(t)
	srvCert, srvKey := ca.issue(t, "engine", 10)
	cliCert, cliKey := ca.issue(t, "gateway-client", 11)
	kp, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var auths []string
	eng := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/metrics":
			io.WriteString(w, "vllm:num_requests_waiting{model_name=\"q\"} 0\nvllm:num_requests_running{model_name=\"q\"} 0\n")
			return
		case "/tokenize":
			http.NotFound(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer engine-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"Unauthorized"}`)
			return
		}
		okCompletion(w, r, nil)
	}))
	eng.TLS = &tls.Config{Certificates: []tls.Certificate{kp}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool()}
	eng.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below
	eng.StartTLS()
	t.Cleanup(eng.Close)

	ep := fmt.Sprintf("      - {id: e0, engine: vllm, url: %q, chat_token_ids: off, api_key_env: KVGATE_TEST_ENGINE_KEY}\n", eng.URL)
	extra := map[string]string{"KVGATE_TEST_ENGINE_KEY": "engine-secret"}
	g, err := startGatewayEnv(t, gwYAML(ep, fmt.Sprintf("client_api_keys_env: KVGATE_TEST_KEYS\nupstream_tls: {ca_file: %q, cert_file: %q, key_file: %q}\n",
		ca.caFile, cliCert, cliKey)), extra)
	if err != nil {
		t.Fatal(err)
	}
	c := openai.NewClient(option.WithBaseURL("http://"+g.Addr()+"/v1"), option.WithAPIKey("ck1"), option.WithMaxRetries(0))
	for range 3 {
		cc, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen3", MaxTokens: openai.Int(1),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello over mTLS")}})
		if err != nil || cc.Choices[0].Message.Content != "ok" {
			t.Fatalf("%v %+v", err, cc)
		}
	}
	mu.Lock()
	if len(auths) != 3 {
		t.Fatalf("engine requests %d", len(auths))
	}
	for _, a := range auths {
		if a != "Bearer engine-secret" || strings.Contains(a, "ck1") {
			t.Fatalf("engine saw Authorization %q", a)
		}
	}
	auths = nil
	mu.Unlock()

	// The same without a client certificate: the engine refuses the handshake (no request reaches it).
	g2, err := startGatewayEnv(t, gwYAML(ep, fmt.Sprintf("upstream_tls: {ca_file: %q}\n", ca.caFile)), extra)
	if err != nil {
		t.Fatal(err)
	}
	code, _, body := post(t, "http://"+g2.Addr()+"/v1/chat/completions", `{"model":"qwen3","max_tokens":1,"messages":[{"role":"user","content":"no cert"}]}`)
	mu.Lock()
	n := len(auths)
	mu.Unlock()
	if code == 200 || n != 0 {
		t.Fatalf("without a client certificate: %d %s, %d engine requests", code, body, n)
	}
}

// Issue 17 item 5: the listener serves TLS with the configured certificate and, when its files are
// replaced, new connections get the new one (no restart); the official client verifies it with the CA.
func TestListenerTLSReload(t *testing.T) {
	engines := startSims(t, 1, nil)
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, "listener", 100)
	g, err := startGatewayEnv(t, gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("tls: {cert_file: %q, key_file: %q}\n", certFile, keyFile)), nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}, DisableKeepAlives: true}}
	c := openai.NewClient(option.WithBaseURL("https://"+g.Addr()+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0),
		option.WithHTTPClient(hc))
	serial := func() int64 {
		var resp *http.Response
		_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "qwen3", MaxTokens: openai.Int(1),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("over TLS")}}, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	if s := serial(); s != 100 {
		t.Fatalf("served certificate serial %d, want 100", s)
	}
	// Plain HTTP on the TLS port gets no answer of the API.
	if resp, err := http.Get("http://" + g.Addr() + "/healthz"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `"status":"ok"`) {
			t.Fatal("plain HTTP served on the TLS listener")
		}
	}
	time.Sleep(50 * time.Millisecond)
	ca.issue(t, "listener", 200) // same files, new certificate
	deadline := time.Now().Add(5 * time.Second)
	for serial() != 200 {
		if time.Now().After(deadline) {
			t.Fatal("the replaced certificate was never served")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Issue 17 item 5: the store over TLS (a real redis-server with --tls-port and client certificates
// required) as an ACL user: the gateway routes on it, its connections are the ACL user's over TLS, and a
// wrong password leaves a gateway degraded (store unreachable), not silently on the default user.
func TestRedisTLSAndACLUser(t *testing.T) {
	ca := newTestCA(t)
	rCert, rKey := ca.issue(t, "redis", 20)
	cCert, cKey := ca.issue(t, "redis-client", 21)
	tlsPort := freeTCPPort(t)
	rs := redistest.StartArgs(t, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", rCert, "--tls-key-file", rKey,
		"--tls-ca-cert-file", ca.caFile, "--tls-auth-clients", "yes",
		"--user", "kvgate", "on", ">gw-pass", "~*", "&*", "+@all")
	engines := startSims(t, 1, nil)
	store := func(pwEnv string) string {
		return fmt.Sprintf("store: {kind: redis, addrs: [\"127.0.0.1:%d\"], username: kvgate, password_env: %s, tls: {ca_file: %q, cert_file: %q, key_file: %q}}\n",
			tlsPort, pwEnv, ca.caFile, cCert, cKey)
	}
	env := map[string]string{"KVGATE_TEST_REDIS_PW": "gw-pass", "KVGATE_TEST_REDIS_BAD": "wrong"}
	g, err := startGatewayEnv(t, gwYAML(simEndpointsYAML(engines, 64), store("KVGATE_TEST_REDIS_PW")), env)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, b := post(t, "http://"+g.Addr()+"/v1/completions", `{"model":"qwen3","max_tokens":1,"prompt":"through a TLS store"}`); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	_, _, ready := get(t, "http://"+g.Addr()+"/readyz", "admintok")
	if !strings.Contains(string(ready), `"degraded":false`) {
		t.Fatalf("readyz: %s", ready)
	}
	// The server's view (on its plain loopback port): the gateway's connections are user kvgate; the
	// store has the gateway's keys.
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	list, err := rc.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, "user=kvgate") {
		t.Fatalf("no connection of user kvgate:\n%s", list)
	}
	if n, _ := rc.DBSize(context.Background()).Result(); n == 0 {
		t.Fatal("the gateway wrote nothing to the TLS store")
	}
	// A plain (non-TLS) client on the TLS port gets no answer.
	plain := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", tlsPort), Username: "kvgate", Password: "gw-pass",
		DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	if err := plain.Ping(context.Background()).Err(); err == nil {
		t.Fatal("the TLS port answered a plain client")
	}
	plain.Close()

	bad, err := startGatewayEnv(t, gwYAML(simEndpointsYAML(engines, 64), store("KVGATE_TEST_REDIS_BAD")), env)
	if err != nil {
		if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("wrong password: %v", err)
		}
		return
	}
	_, _, ready = get(t, "http://"+bad.Addr()+"/readyz", "admintok")
	if !strings.Contains(string(ready), `"degraded":true`) {
		t.Fatalf("a wrong password: readyz %s", ready)
	}
}

// get sends a GET with an optional bearer token.
func get(t *testing.T, url, token string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}
