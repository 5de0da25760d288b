package plugins

import "github.com/kvgate/kvgate/sdk"

// Sample is one named snapshot Load sends to a module during validation.
type Sample struct {
	Name     string   // short label shown in ValidationReport
	Snapshot Snapshot // what the module is asked to rank
}

// SampleSnapshots returns the validation samples: the edge cases (no endpoint, none healthy, one
// endpoint, empty prompt), the failure-mode snapshots of plugins/testdata/decisions, and pseudo-random fleets of 8, 16 and
// 64 endpoints (fixed seeds). A module must answer each with a valid ranking within the call deadline.
// The returned value is fresh on every call.
func SampleSnapshots() []Sample {
	req := sdk.Request{Seq: 1, PromptTokens: 256, PromptBlocks: 16, BlockSize: 16, ModelHash: 0x6b76676174650001, Seed: 42}
	ep := func(gpu, cpu, waiting, inflight uint32) sdk.Endpoint {
		return sdk.Endpoint{Flags: sdk.FlagHealthy, GPUBlocks: gpu, CPUBlocks: cpu, Waiting: waiting,
			InFlightRequests: inflight, KVCacheUtilization: 0.5}
	}
	out := []Sample{
		{"no-endpoints", Snapshot{Request: req}},
		{"none-healthy", Snapshot{Request: req, Endpoints: []sdk.Endpoint{{Waiting: 1}, {GPUBlocks: 4}}}},
		{"one-endpoint", Snapshot{Request: req, Endpoints: []sdk.Endpoint{ep(0, 0, 3, 0)}}},
		{"empty-prompt", Snapshot{Request: sdk.Request{BlockSize: 16, Seed: 7}, Endpoints: []sdk.Endpoint{ep(0, 0, 2, 0), ep(0, 0, 0, 1)}}},
		{"hot-endpoint-idle-owner", Snapshot{Request: req, Endpoints: []sdk.Endpoint{ep(0, 0, 100, 0), ep(0, 0, 0, 0), ep(16, 0, 0, 0)}}},
		{"miss-small-tree-busy", Snapshot{Request: req, Endpoints: []sdk.Endpoint{ep(1, 0, 50, 0), ep(0, 0, 0, 0)}}},
		{"prefix-on-overloaded", Snapshot{Request: req, Endpoints: []sdk.Endpoint{ep(16, 0, 40, 0), ep(0, 0, 2, 0), ep(0, 0, 0, 0), ep(0, 0, 5, 0)}}},
		{"cpu-tier-only", Snapshot{Request: req, Endpoints: []sdk.Endpoint{ep(2, 10, 1, 0), ep(8, 0, 1, 0)}}},
	}
	for _, n := range []int{8, 16, 64} {
		out = append(out, Sample{Name: "random-" + itoa(n), Snapshot: RandomSnapshot(uint64(n)*7919, n)})
	}
	return out
}

// RandomSnapshot returns a reproducible pseudo-random snapshot of n endpoints drawn from seed: prompts of
// 0–4096 tokens in blocks of 16, matches up to the prompt's blocks split over GPU and CPU, loads 0–40,
// about one endpoint in eight unhealthy. Tests and benchmarks use it.
func RandomSnapshot(seed uint64, n int) Snapshot {
	r := sdk.NewRand(seed)
	tokens := uint32(r.Intn(4097))
	if r.Intn(8) == 0 {
		tokens = 0
	}
	blocks := tokens / 16
	s := Snapshot{Request: sdk.Request{Seq: r.Uint64() >> 1, PromptTokens: tokens, PromptBlocks: blocks, BlockSize: 16,
		ModelHash: r.Uint64(), Seed: r.Uint64()}}
	s.Endpoints = make([]sdk.Endpoint, n)
	shared := uint32(r.Intn(int(blocks) + 1))
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		e.Index = uint32(i)
		if r.Intn(8) != 0 {
			e.Flags = sdk.FlagHealthy
		}
		if blocks > 0 && r.Intn(3) == 0 {
			m := uint32(r.Intn(int(shared) + 1))
			e.GPUBlocks = uint32(r.Intn(int(m) + 1))
			e.CPUBlocks = m - e.GPUBlocks
		}
		e.Waiting = uint32(r.Intn(41))
		e.Running = uint32(r.Intn(64))
		e.InFlightRequests = uint32(r.Intn(21))
		e.InFlightTokens = uint64(e.InFlightRequests) * uint64(r.Intn(8192))
		e.KVCacheUtilization = float32(r.Intn(1001)) / 1000
	}
	return s
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
