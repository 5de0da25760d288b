package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/gateway/config"
)

// Shared-prefix workload shape: groups of users share a system prompt; engines have small GPU caches so a
// policy that scatters a group pays with evictions.
const (
	qualityEngines   = 4
	qualityGroups    = 12
	qualityClients   = 8
	qualityGPUBlocks = 160 // per engine: 2560 tokens, about four of the twelve groups' prefixes
)

// qualityRow is one policy's result.
type qualityRow struct {
	Policy       string
	Err          string
	Prompt       int64 // prompt tokens over all requests
	Cached       int64 // cached tokens the engines reported
	PerEndpoint  map[string]int
	MaxOverMean  float64
	Wall         time.Duration
	PolicyHeader string
}

func (b *bench) quality(ctx context.Context) error {
	engines, err := b.engines(ctx, "q", qualityEngines, harness.EngineOptions{TimeScale: 0.02,
		NumGPUBlocks: qualityGPUBlocks})
	if err != nil {
		return err
	}
	g, err := b.gateway(ctx, "quality", engines, config.StoreMemory, "")
	if err != nil {
		return err
	}
	model := b.base.Name
	e := engines[0]
	sysWords, err := wordsFor(ctx, e, model, 500)
	if err != nil {
		return err
	}
	userWords, _ := wordsFor(ctx, e, model, 40)
	r := rand.New(rand.NewPCG(5, 5))
	systems := make([]string, qualityGroups)
	for i := range systems {
		systems[i] = fmt.Sprintf("Group %d instructions. ", i) + text(r, sysWords)
	}
	// Requests: group popularity skewed (group k drawn with weight 1/(k+1)), unique user messages.
	n := b.o.requests
	bodies := make([][]byte, n)
	weights := make([]float64, qualityGroups)
	var wsum float64
	for k := range weights {
		weights[k] = 1 / float64(k+1)
		wsum += weights[k]
	}
	for i := range bodies {
		x := r.Float64() * wsum
		k := 0
		for ; k < qualityGroups-1 && x > weights[k]; k++ {
			x -= weights[k]
		}
		bodies[i] = chatBody(model, systems[k], fmt.Sprintf("User %d asks: ", i)+text(r, userWords), 8)
	}
	// The oracle: one infinite cache serving the requests in this order.
	prompts := make([][]uint32, n)
	var promptTotal int64
	for i, body := range bodies {
		if prompts[i], err = e.Tokenize(ctx, body); err != nil {
			return err
		}
		promptTotal += int64(len(prompts[i]))
	}
	oracle := harness.OracleCachedTokens(prompts, b.base.BlockSize)
	fmt.Fprintf(b.out, "\nquality workload: %d requests, %d groups (~%d-token system prompts, skewed popularity), %d clients, %d engines × %d GPU blocks\n",
		n, qualityGroups, len(prompts[0])-userWords, qualityClients, qualityEngines, qualityGPUBlocks)

	var rows []qualityRow
	var explain []byte
	for _, p := range b.o.policies {
		row := qualityRow{Policy: p}
		if err := b.activate(ctx, g, p); err != nil {
			row.Err = err.Error()
			rows = append(rows, row)
			continue
		}
		// Fresh caches: engines drop every block (AllBlocksCleared reaches the index); speculative entries
		// expire after the speculative TTL.
		for _, en := range engines {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, en.URL()+"/reset_prefix_cache", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
		}
		time.Sleep(max(config.DefaultSpeculativeTTL, b.cfg.SpeculativeTTL) + 500*time.Millisecond)
		if err := b.runQuality(ctx, g, bodies, &row); err != nil {
			row.Err = err.Error()
		}
		if p == config.DefaultPolicyName && explain == nil {
			// One routing decision on the warm system, as POST /admin/v1/route explains it.
			if ex, err := g.Explain(ctx, bodies[len(bodies)-1]); err == nil {
				explain, _ = json.MarshalIndent(ex, "", "  ")
			}
		}
		rows = append(rows, row)
		fmt.Fprintf(b.out, "  measured %s\n", p)
	}
	w := tabwriter.NewWriter(b.out, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "policy\thit rate\tof oracle\trequests per endpoint\tmax/mean\twall\t")
	fmt.Fprintf(w, "oracle (one infinite cache)\t%.3f\t1.00\t\t\t\t\n", float64(oracle)/float64(promptTotal))
	for _, row := range rows {
		if row.Err != "" {
			fmt.Fprintf(w, "%s\terror: %s\t\t\t\t\t\n", row.Policy, firstLine(row.Err))
			continue
		}
		hit := float64(row.Cached) / float64(row.Prompt)
		var counts []string
		for _, en := range engines {
			counts = append(counts, fmt.Sprint(row.PerEndpoint[en.ID]))
		}
		fmt.Fprintf(w, "%s\t%.3f\t%.2f\t%s\t%.2f\t%s\t\n", row.Policy, hit, float64(row.Cached)/float64(oracle),
			strings.Join(counts, "/"), row.MaxOverMean, row.Wall.Round(time.Millisecond))
	}
	w.Flush()
	if explain != nil {
		fmt.Fprintf(b.out, "\nPOST /admin/v1/route for the last request, warm system, three-tier:\n%s\n", explain)
	}
	return nil
}

// activate makes policy p the model's active policy on g: the built-in three-tier by its loaded version,
// an example by building examples/policies/<p> for wasip1 and uploading it.
func (b *bench) activate(ctx context.Context, g *harness.Gateway, p string) error {
	var version string
	if p == config.DefaultPolicyName {
		l, err := g.Policies(ctx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(l.Versions, func(v gateway.AdminVersion) bool { return v.Name == p })
		if i < 0 {
			return fmt.Errorf("%s is not loaded", p)
		}
		version = string(l.Versions[i].Version)
	} else {
		out := filepath.Join(b.dir, p+".wasm")
		if err := harness.BuildWasm(ctx, b.root, filepath.Join("examples", "policies", p), out); err != nil {
			return err
		}
		wasm, err := os.ReadFile(out)
		if err != nil {
			return err
		}
		up, err := g.UploadPolicy(ctx, p, wasm)
		if err != nil {
			return err
		}
		version = string(up.Version)
	}
	return g.ActivatePolicy(ctx, b.base.Name, version, nil)
}

func (b *bench) runQuality(ctx context.Context, g *harness.Gateway, bodies [][]byte, row *qualityRow) error {
	row.PerEndpoint = map[string]int{}
	var mu sync.Mutex
	var firstErr error
	work := make(chan []byte)
	var wg sync.WaitGroup
	c := newClient()
	start := time.Now()
	for range qualityClients {
		wg.Go(func() {
			for body := range work {
				a, err := post(ctx, c, g.URL(), body)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				row.Prompt += a.PromptTokens
				row.Cached += a.CachedTokens
				if a.Endpoint != "" {
					row.PerEndpoint[a.Endpoint]++
				}
				mu.Unlock()
			}
		})
	}
	for _, body := range bodies {
		work <- body
	}
	close(work)
	wg.Wait()
	row.Wall = time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	maxN, sum := 0, 0
	for _, v := range row.PerEndpoint {
		maxN = max(maxN, v)
		sum += v
	}
	if sum > 0 {
		row.MaxOverMean = float64(maxN) / (float64(sum) / qualityEngines)
	}
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return s
}
