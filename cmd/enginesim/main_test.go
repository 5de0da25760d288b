package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func noEnv(string) string { return "" }

// The done-when command line parses into the intended config.
func TestParseDoneWhenCommand(t *testing.T) {
	cfg, err := parseFlags([]string{"--model", "../../examples/models/qwen3", "--served-model-name", "qwen3", "--port", "8001",
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}`}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.KVEvents
	if cfg.Port != 8001 || len(cfg.ServedModelNames) != 1 || cfg.ServedModelNames[0] != "qwen3" || !k.EnableKVCacheEvents ||
		k.Publisher != "zmq" || k.Endpoint != "tcp://*:5557" || k.ReplayEndpoint != "tcp://*:5558" || k.BufferSteps != 10000 || cfg.HashSeed != "0" {
		t.Fatalf("config %+v", cfg)
	}
}

func TestParseFlagsVariants(t *testing.T) {
	cfg, err := parseFlags([]string{"mymodel", "--no-enable-prefix-caching", "--lora-modules", "sql=/x,chat", "--kv-offload-events", "placeholder",
		"--num-cpu-blocks", "64", "--time-scale", "0.01", "--fault-stall-before-headers", "2s"}, func(k string) string {
		if k == "PYTHONHASHSEED" {
			return "42"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model != "mymodel" || cfg.EnablePrefixCaching || strings.Join(cfg.LoRAModules, ",") != "sql,chat" || cfg.CPUEventsSelfDescribing ||
		cfg.NumCPUBlocks != 64 || cfg.TimeScale != 0.01 || cfg.HashSeed != "42" || time.Duration(cfg.Faults.StallBeforeHeaders) != 2*time.Second {
		t.Fatalf("config %+v", cfg)
	}
	if dp, err := parseFlags([]string{"m", "--data-parallel-size", "4"}, noEnv); err != nil || dp.DataParallelSize != 4 {
		t.Fatalf("--data-parallel-size 4: %v %d", err, dp.DataParallelSize)
	}
	if cfg.DataParallelSize != 1 {
		t.Fatalf("default data-parallel size %d, want 1", cfg.DataParallelSize)
	}
	for _, bad := range [][]string{
		{"--model", "m", "--prefix-caching-hash-algo", "sha256"},
		{"--model", "m", "--kv-events-config", `{"enable_kv_cache_events":true,"bogus":1}`},
		{"--model", "m", "--kv-offload-events", "maybe"},
		{"--model", "m", "--block-size", "0"},
		{"--model", "m", "--data-parallel-size", "-1"},
		{"--model", "m", "--data-parallel-size", "65"},
		{},
		{"a", "b"},
	} {
		if _, err := parseFlags(bad, noEnv); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// --help documents every flag, each with a description.
func TestHelpDocumentsEveryFlag(t *testing.T) {
	if os.Getenv("ENGINESIM_HELP_CHILD") == "1" {
		_, err := parseFlags([]string{"--help"}, noEnv)
		if err == pflag.ErrHelp {
			os.Exit(0)
		}
		os.Exit(3)
	}
	cmd := exec.Command(os.Args[0], "-test.run=TestHelpDocumentsEveryFlag")
	cmd.Env = append(os.Environ(), "ENGINESIM_HELP_CHILD=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("--help: %v\n%s", err, stderr.String())
	}
	help := stderr.String()
	for _, f := range []string{"model", "served-model-name", "lora-modules", "enable-lora", "host", "port", "block-size",
		"num-gpu-blocks-override", "num-cpu-blocks", "enable-prefix-caching", "no-enable-prefix-caching",
		"prefix-caching-hash-algo", "hash-seed", "max-model-len", "max-num-seqs", "max-num-batched-tokens",
		"default-max-tokens", "kv-events-config", "kv-events-encoding", "kv-events-hash-form", "kv-offload-events",
		"time-scale", "step-overhead", "decode-per-seq", "prefill-per-token", "cpu-reload-per-token", "kv-bytes-per-token",
		"fault-fail-status", "fault-fail-count", "fault-close-after-chunks", "fault-close-count",
		"fault-stall-before-headers", "fault-stall-count", "fault-drop-event-batches", "log-level"} {
		i := strings.Index(help, "--"+f+" ")
		if i < 0 {
			t.Errorf("--help lacks --%s", f)
			continue
		}
		line := help[i:]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		if len(strings.Fields(line)) < 4 {
			t.Errorf("--%s has no description: %q", f, line)
		}
	}
	if n := strings.Count(help, "\n  "); n < 35 {
		t.Errorf("help has %d flag lines, want every flag:\n%s", n, help)
	}
}

// The command serves the done-when configuration (free ports instead of fixed ones) and stops cleanly on
// SIGTERM.
func TestCommandServesAndStops(t *testing.T) {
	if os.Getenv("ENGINESIM_RUN_CHILD") == "1" {
		var args []string
		if err := json.Unmarshal([]byte(os.Getenv("ENGINESIM_ARGS")), &args); err != nil {
			os.Exit(4)
		}
		if err := run(args); err != nil {
			os.Stderr.WriteString("run: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	args := []string{"--model", "../../examples/models/qwen3", "--served-model-name", "qwen3", "--port", "0", "--host", "127.0.0.1",
		"--time-scale", "0", "--kv-events-config",
		`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0"}`}
	argsJSON, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=TestCommandServesAndStops")
	cmd.Env = append(os.Environ(), "ENGINESIM_RUN_CHILD=1", "ENGINESIM_ARGS="+string(argsJSON))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var httpAddr string
	deadline := time.After(30 * time.Second)
	for httpAddr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("enginesim exited before starting")
			}
			if strings.Contains(l, "enginesim started") {
				for _, f := range strings.Fields(l) {
					if a, ok := strings.CutPrefix(f, "http="); ok {
						httpAddr = a
					}
				}
				if !strings.Contains(l, "events=tcp://127.0.0.1:") || !strings.Contains(l, "replay=tcp://127.0.0.1:") {
					t.Fatalf("start line without event addresses: %s", l)
				}
			}
		case <-deadline:
			t.Fatal("enginesim did not start")
		}
	}
	resp, err := http.Post("http://"+httpAddr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"qwen3","messages":[{"role":"user","content":"Hello"}],"max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":3`) {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() {
		for range lines {
		}
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("enginesim did not stop on SIGTERM")
	}
}
