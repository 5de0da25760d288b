// Package gateway assembles one kvgate gateway from its configuration: the store (memory or Redis), the
// policy host with each model's configured policy, endpoint probes, per-endpoint KV-event ingesters, the
// routing pipeline (gateway/internal/route) and the HTTP server (gateway/internal/server) with the admin API (gateway/internal/admin).
// `kvgate serve` calls Start; tests start several in one process.
//
// Sub-packages: config (the YAML file), openai (errors, request fields, token-ID splicing), endpoints
// (health and load scrapes), route (tokenize → keys → match → snapshot → rank → reserve → record),
// upstream (the engine client), server (Fiber front, auth, streaming), admin (policies, explain), metrics.
package gateway
