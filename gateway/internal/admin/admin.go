// Package admin is the gateway's admin API, mounted under /admin/v1 behind the server's auth middleware
// (bearer admin token, compared in constant time, decided on the normalized path):
//
//	PUT  /admin/v1/policies/{name}      body: a Wasm module (≤ max_policy_bytes) → 201 + validation report
//	GET  /admin/v1/policies             loaded versions and each model's active version and config
//	POST /admin/v1/policies/activate    {"model","version":"name@sha256","config":{...}} → 200
//	POST /admin/v1/policies/rollback    {"model"} → 200 with the version now active; 409 no_previous
//	DELETE /admin/v1/policies/{version} → 200 {"version","unloaded":true}; 404 policy_not_found,
//	                                    409 policy_in_use (active, previous or configured policy of a model's
//	                                    stack, or built in)
//	POST /admin/v1/route                a chat or completions body → the routing decision, not forwarded
//
// A version is "name@" + the module's lowercase hex sha256; activate and DELETE accept a unique prefix of
// at least 8 hex digits. Errors use the OpenAI error shape.
//
// With a Sync (every gateway), activate, rollback and DELETE are one atomic step each on the store's fleet
// state (each model's activation stack), so every gateway gives the same answer and follows the result:
// DELETE removes the stored module and the stack entries naming it, refused while it is a stack's active
// or previous entry or its floor (the configured policy). GET adds "fleet": each model's stack and the
// gateways that do not serve its active version, and why.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/server"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/plugins"
)

// Host is the part of plugins.Host the admin API drives.
type Host interface {
	Load(name string, wasm []byte) (plugins.Version, plugins.ValidationReport, error)
	Activate(model string, v plugins.Version, configJSON []byte) error
	Rollback(model string) error
	Versions() []plugins.VersionInfo
	Active(model string) (plugins.Version, []byte)
	// Unload forgets v (plugins.ErrUnknownVersion; plugins.ErrVersionInUse while active, kept warm for a
	// rollback, or built in).
	Unload(v plugins.Version) error
}

// Sync carries policy operations to the store's fleet state, the one truth every gateway sharing the store
// follows (nil: a single gateway without a store, driving Host directly).
type Sync interface {
	// PolicyLoaded stores an accepted module so every gateway loads it.
	PolicyLoaded(ctx context.Context, name string, wasm []byte) error
	// StoredVersions lists the versions stored for every gateway, loaded here or not (still compiling, or
	// failed to load here), so DELETE can remove those too.
	StoredVersions(ctx context.Context) ([]plugins.Version, error)
	// Activate builds (v, configJSON) here, then pushes it on model's activation stack in the store. Errors:
	// the host's (plugins.ErrInitFailed, ErrUnknownVersion, ErrVersionDisabled), kvstore.ErrNotFound (the
	// module is no longer stored), other errors: the store is unavailable.
	Activate(ctx context.Context, model string, v plugins.Version, configJSON []byte) error
	// Rollback pops model's stack in the store (one step for the whole fleet) and returns the version now
	// active. kvstore.ErrNoPrevious at the configured policy.
	Rollback(ctx context.Context, model string) (plugins.Version, error)
	// Unload removes v from the store and then from this gateway. Errors: kvstore.ErrNotFound (not stored),
	// *kvstore.PolicyInUseError (active, previous or floor of a model's stack, or named by an older gateway).
	Unload(ctx context.Context, v plugins.Version) error
	// Fleet is the fleet's view per configured model: the store's stack and every live gateway's report.
	Fleet(ctx context.Context) (map[string]FleetModel, error)
}

// ModelServing is what one gateway serves for one model, what the store says it should, and why not.
type ModelServing struct {
	Serving     string `json:"serving"`                // the version it serves
	Want        string `json:"want"`                   // the store's active version
	Error       string `json:"error,omitempty"`        // why it does not serve Want ("failed to load …: cause")
	Attempts    int    `json:"attempts,omitempty"`     // failed load attempts of Want so far
	NextAttempt string `json:"next_attempt,omitempty"` // RFC 3339: when the load is tried again
}

// FleetEntry is one entry of a model's activation stack.
type FleetEntry struct {
	Version plugins.Version `json:"version"`
	Config  json.RawMessage `json:"config"`
}

// Disagreement is a gateway that does not serve its model's active version, and why.
type Disagreement struct {
	Gateway string `json:"gateway"`
	Serving string `json:"serving"`
	Error   string `json:"error"`
}

// FleetModel is one model in the "fleet" part of GET /admin/v1/policies.
type FleetModel struct {
	Active   plugins.Version         `json:"active"`   // the top of the stack
	Stack    []FleetEntry            `json:"stack"`    // oldest first; the first entry is the configured policy (the floor)
	Gateways map[string]ModelServing `json:"gateways"` // by gateway ID, every gateway with a live report
	Disagree []Disagreement          `json:"disagree"` // the gateways not serving Active, sorted by ID
}

// Model is one served model for explain.
type Model struct {
	Model *route.Model
	LoRA  string
}

// API is the admin API. Create with New and Mount it.
type API struct {
	Host           Host
	Sync           Sync
	Router         *route.Router
	Models         map[string]Model // by client-facing name
	ModelNames     []string         // base model names (activation targets)
	MaxPolicyBytes int64
}

// Mount adds the routes to r (the /admin/v1 group).
func (a *API) Mount(r fiber.Router) {
	r.Put("/policies/:name", a.upload)
	r.Get("/policies", a.list)
	r.Post("/policies/activate", a.activate)
	r.Post("/policies/rollback", a.rollback)
	r.Delete("/policies/:version", a.unload)
	r.Post("/route", a.explain)
}

func fail(c *fiber.Ctx, e *openai.Error) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(e.Status).Send(e.JSON())
}

// UploadResponse is the body of PUT /admin/v1/policies/{name} (201 accepted, 422 rejected).
type UploadResponse struct {
	Version  plugins.Version `json:"version"`  // name@sha256 of the uploaded module
	Accepted bool            `json:"accepted"` // false: Report.Problems says why
	Report   Report          `json:"report"`
}

// Report is plugins.ValidationReport as the admin API shows it: snake_case names, durations in seconds.
type Report struct {
	Version        plugins.Version `json:"version"`         // name@sha256
	SizeBytes      int             `json:"size_bytes"`      // module size
	CompileSeconds float64         `json:"compile_seconds"` // wazero compilation time (near 0 from a warm cache)
	ABIMinor       int32           `json:"abi_minor"`       // the guest's minor ABI version (-1 if unknown)
	BufferBytes    uint32          `json:"buffer_bytes"`    // the guest's input buffer size
	Imports        []string        `json:"imports"`         // "module.name", sorted
	Exports        []string        `json:"exports"`         // exported function names, sorted
	Samples        []Sample        `json:"samples"`         // one per validation sample snapshot, in order
	Problems       []string        `json:"problems"`        // empty when accepted
}

// Sample is plugins.SampleResult as the admin API shows it.
type Sample struct {
	Name            string  `json:"name"`             // sample snapshot name
	Endpoints       int     `json:"endpoints"`        // endpoints in the snapshot
	Ranking         []int   `json:"ranking"`          // the module's answer: indices into the endpoints
	DurationSeconds float64 `json:"duration_seconds"` // wall time of the call
	Problem         string  `json:"problem,omitempty"`
}

// NewReport maps a validation report to its admin JSON form (lists are never null).
func NewReport(r plugins.ValidationReport) Report {
	out := Report{Version: r.Version, SizeBytes: r.SizeBytes, CompileSeconds: r.CompileTime.Seconds(),
		ABIMinor: r.ABIMinor, BufferBytes: r.BufferCap, Imports: nonNil(r.Imports), Exports: nonNil(r.Exports),
		Samples: make([]Sample, 0, len(r.Samples)), Problems: nonNil(r.Problems)}
	for _, s := range r.Samples {
		out.Samples = append(out.Samples, Sample{Name: s.Name, Endpoints: s.Endpoints, Ranking: nonNil(s.Ranking),
			DurationSeconds: s.Duration.Seconds(), Problem: s.Problem})
	}
	return out
}

// VersionJSON is plugins.VersionInfo as GET /admin/v1/policies shows it.
type VersionJSON struct {
	Version   plugins.Version `json:"version"`    // name@sha256
	Name      string          `json:"name"`       // the name it was uploaded under
	SHA256    string          `json:"sha256"`     // lowercase hex digest of the module
	SizeBytes int             `json:"size_bytes"` // module size
	Builtin   bool            `json:"builtin"`    // the embedded three-tier module
	Disabled  bool            `json:"disabled"`   // disabled after missed deadlines
	ActiveFor []string        `json:"active_for"` // models it is active for, sorted
	LoadedAt  time.Time       `json:"loaded_at"`  // RFC 3339
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (a *API) upload(c *fiber.Ctx) error {
	name := strings.Clone(c.Params("name")) // Fiber reuses the buffer behind Params
	wasm := c.Body()
	if int64(len(wasm)) > a.MaxPolicyBytes {
		return fail(c, openai.TooLarge(a.MaxPolicyBytes))
	}
	if len(wasm) == 0 {
		return fail(c, openai.BadRequest("body", "The body must be a Wasm module."))
	}
	wasm = append([]byte(nil), wasm...)
	v, rep, err := a.Host.Load(name, wasm)
	if err != nil {
		if errors.Is(err, plugins.ErrBadName) {
			return fail(c, openai.BadRequest("name", "%v", err))
		}
		if errors.Is(err, plugins.ErrInvalidModule) {
			return c.Status(fiber.StatusUnprocessableEntity).JSON(UploadResponse{Version: rep.Version, Report: NewReport(rep)})
		}
		return fail(c, openai.Errorf(500, "server_error", "", "", "%v", err))
	}
	if a.Sync != nil {
		if err := a.Sync.PolicyLoaded(c.UserContext(), name, wasm); err != nil {
			return fail(c, openai.Errorf(503, "server_error", "", "store_unavailable", "Loaded here but not stored: %v", err))
		}
	}
	return c.Status(fiber.StatusCreated).JSON(UploadResponse{Version: v, Accepted: true, Report: NewReport(rep)})
}

// ActiveInfo is one model's active policy in GET /admin/v1/policies.
type ActiveInfo struct {
	Version plugins.Version `json:"version"`
	Config  json.RawMessage `json:"config"`
}

// ListResponse is the body of GET /admin/v1/policies.
type ListResponse struct {
	Versions []VersionJSON         `json:"versions"`        // every version loaded here, sorted
	Active   map[string]ActiveInfo `json:"active"`          // by model: what this gateway serves
	Fleet    map[string]FleetModel `json:"fleet,omitempty"` // by model: the store's view (with a Sync)
}

func (a *API) list(c *fiber.Ctx) error {
	out := ListResponse{Versions: []VersionJSON{}, Active: map[string]ActiveInfo{}}
	for _, v := range a.Host.Versions() {
		out.Versions = append(out.Versions, VersionJSON{Version: v.Version, Name: v.Name, SHA256: v.SHA256,
			SizeBytes: v.SizeBytes, Builtin: v.Builtin, Disabled: v.Disabled, ActiveFor: nonNil(v.ActiveFor),
			LoadedAt: v.LoadedAt})
	}
	for _, m := range a.ModelNames {
		v, cfg := a.Host.Active(m)
		if len(cfg) == 0 {
			cfg = []byte("null")
		}
		out.Active[m] = ActiveInfo{Version: v, Config: cfg}
	}
	if a.Sync != nil {
		fleet, err := a.Sync.Fleet(c.UserContext())
		if err != nil {
			return fail(c, openai.Errorf(503, "server_error", "", "store_unavailable", "Cannot read the fleet's policy state: %v", err))
		}
		out.Fleet = fleet
	}
	return c.JSON(out)
}

// ActivateRequest is the body of POST /admin/v1/policies/activate.
type ActivateRequest struct {
	Model   string          `json:"model"`
	Version string          `json:"version"`
	Config  json.RawMessage `json:"config"`
}

// Errors of ResolveVersion: plugins' (wrapped with the version asked for; match with errors.Is).
var (
	ErrBadVersion       = plugins.ErrBadVersion       // not "name@" followed by at least 8 hex digits
	ErrVersionNotFound  = plugins.ErrVersionNotFound  // no listed version matches
	ErrVersionAmbiguous = plugins.ErrVersionAmbiguous // the hex prefix matches more than one listed version
)

// ResolveVersion finds the listed version named by s: exact, or name@ plus a unique hex prefix (≥ 8,
// any case): plugins.ResolveVersion over the listed versions, without bare names.
func ResolveVersion(versions []plugins.VersionInfo, s string) (plugins.Version, error) {
	vs := make([]plugins.Version, len(versions))
	for i, v := range versions {
		vs[i] = v.Version
	}
	return plugins.ResolveVersion(vs, s, false)
}

func (a *API) hasModel(m string) bool {
	for _, n := range a.ModelNames {
		if n == m {
			return true
		}
	}
	return false
}

func (a *API) activate(c *fiber.Ctx) error {
	var req ActivateRequest
	if err := json.Unmarshal(c.Body(), &req); err != nil {
		return fail(c, openai.BadRequest("", "Body must be {\"model\",\"version\",\"config\"}: %v", err))
	}
	if !a.hasModel(req.Model) {
		return fail(c, openai.ModelNotFound(req.Model))
	}
	v, err := ResolveVersion(a.Host.Versions(), req.Version)
	if err != nil {
		return fail(c, openai.BadRequest("version", "%v", err))
	}
	cfg := []byte(req.Config)
	if len(cfg) == 0 || string(cfg) == "null" {
		cfg = []byte("{}")
	}
	activate := func() error { return a.Host.Activate(req.Model, v, cfg) }
	if a.Sync != nil {
		activate = func() error { return a.Sync.Activate(c.UserContext(), req.Model, v, cfg) }
	}
	if err := activate(); err != nil {
		switch {
		case errors.Is(err, plugins.ErrVersionDisabled):
			return fail(c, openai.Errorf(409, "invalid_request_error", "version", "policy_disabled",
				"%s was disabled after it missed its deadlines or failed; fix it and upload it under another name, or unload it.", v))
		case errors.Is(err, plugins.ErrUnknownVersion):
			return fail(c, openai.Errorf(404, "invalid_request_error", "version", "policy_not_found", "%v", err))
		case errors.Is(err, plugins.ErrInitFailed):
			return fail(c, openai.Errorf(400, "invalid_request_error", "config", "policy_init_failed", "%v", err))
		case errors.Is(err, kvstore.ErrNotFound):
			return fail(c, openai.Errorf(404, "invalid_request_error", "version", "policy_not_found",
				"%s is no longer stored (unloaded through another gateway?): %v", v, err))
		}
		if a.Sync != nil {
			return fail(c, openai.Errorf(503, "server_error", "", "store_unavailable", "Not activated: the store did not take it: %v", err))
		}
		return fail(c, openai.Errorf(500, "server_error", "", "", "%v", err))
	}
	return c.JSON(fiber.Map{"model": req.Model, "version": v})
}

func (a *API) rollback(c *fiber.Ctx) error {
	var req struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(c.Body(), &req); err != nil {
		return fail(c, openai.BadRequest("", "Body must be {\"model\"}: %v", err))
	}
	if !a.hasModel(req.Model) {
		return fail(c, openai.ModelNotFound(req.Model))
	}
	var v plugins.Version
	var err error
	if a.Sync != nil {
		v, err = a.Sync.Rollback(c.UserContext(), req.Model)
	} else if err = a.Host.Rollback(req.Model); err == nil {
		v, _ = a.Host.Active(req.Model)
	}
	if err != nil {
		if errors.Is(err, plugins.ErrNoPrevious) || errors.Is(err, kvstore.ErrNoPrevious) {
			return fail(c, openai.Errorf(409, "invalid_request_error", "model", "no_previous",
				"Nothing to roll back to for `%s`: its active policy is the first one activated (the configuration's).", req.Model))
		}
		if a.Sync != nil {
			return fail(c, openai.Errorf(503, "server_error", "", "store_unavailable", "Not rolled back: %v", err))
		}
		return fail(c, openai.Errorf(500, "server_error", "", "", "%v", err))
	}
	return c.JSON(fiber.Map{"model": req.Model, "version": v})
}

// UnloadResponse is the body of DELETE /admin/v1/policies/{version} (200).
type UnloadResponse struct {
	Version  plugins.Version `json:"version"`  // the full name@sha256 that was unloaded
	Unloaded bool            `json:"unloaded"` // always true on 200
}

// withStored adds the stored versions not loaded here to the loaded ones (for ResolveVersion).
func withStored(local []plugins.VersionInfo, stored []plugins.Version) []plugins.VersionInfo {
	out := slices.Clone(local)
	for _, v := range stored {
		if !plugins.IsVersion(string(v)) || slices.ContainsFunc(local, func(i plugins.VersionInfo) bool { return i.Version == v }) {
			continue
		}
		out = append(out, plugins.VersionInfo{Version: v, Name: v.Name(), SHA256: v.SHA256()})
	}
	return out
}

// inUse is 409 policy_in_use.
func inUse(v plugins.Version, format string, a ...any) *openai.Error {
	return openai.Errorf(fiber.StatusConflict, "invalid_request_error", "version", "policy_in_use",
		"Policy `%s` is in use and stays loaded: %s.", v, fmt.Sprintf(format, a...))
}

func (a *API) unload(c *fiber.Ctx) error {
	raw, err := url.PathUnescape(c.Params("version")) // Params is the raw path segment: "@" may come as %40
	if err != nil {
		return fail(c, openai.BadRequest("version", "The version is not a valid path segment: %v", err))
	}
	ctx := c.UserContext()
	local := a.Host.Versions()
	all := local
	if a.Sync != nil {
		stored, err := a.Sync.StoredVersions(ctx)
		if err != nil {
			return fail(c, openai.Errorf(503, "server_error", "", "store_unavailable", "Cannot read the stored policies: %v", err))
		}
		all = withStored(local, stored)
	}
	v, err := ResolveVersion(all, raw)
	switch {
	case errors.Is(err, ErrVersionNotFound):
		return fail(c, openai.Errorf(fiber.StatusNotFound, "invalid_request_error", "version", "policy_not_found",
			"No policy version `%s` is loaded or stored.", raw))
	case err != nil:
		return fail(c, openai.BadRequest("version", "%v", err))
	}
	i := slices.IndexFunc(local, func(i plugins.VersionInfo) bool { return i.Version == v })
	if i >= 0 && local[i].Builtin {
		return fail(c, inUse(v, "it is the built-in default"))
	}
	if a.Sync != nil {
		var iu *kvstore.PolicyInUseError
		err := a.Sync.Unload(ctx, v)
		switch {
		case errors.As(err, &iu):
			return fail(c, inUse(v, "%s", inUseWhere(iu)))
		case errors.Is(err, kvstore.ErrNotFound) && i < 0:
			return fail(c, openai.Errorf(fiber.StatusNotFound, "invalid_request_error", "version", "policy_not_found",
				"No policy version `%s` is stored.", v))
		case errors.Is(err, kvstore.ErrNotFound): // loaded here only (its upload was never stored): unload it here
		case err != nil:
			return fail(c, openai.Errorf(503, "server_error", "", "store_unavailable", "Not unloaded: %v", err))
		default:
			return c.JSON(UnloadResponse{Version: v, Unloaded: true})
		}
	}
	if err := a.Host.Unload(v); errors.Is(err, plugins.ErrVersionInUse) {
		where := err.Error()
		if _, after, ok := strings.Cut(where, plugins.ErrVersionInUse.Error()+": "); ok {
			where = after // "active for m", "previous activation of m"
		}
		return fail(c, inUse(v, "%s here", where))
	} else if err != nil && !errors.Is(err, plugins.ErrUnknownVersion) { // unknown: unloaded meanwhile
		return fail(c, openai.Errorf(500, "server_error", "", "", "%v", err))
	}
	return c.JSON(UnloadResponse{Version: v, Unloaded: true})
}

// inUseWhere words the store's refusal of an unload.
func inUseWhere(e *kvstore.PolicyInUseError) string {
	switch e.Role {
	case "active":
		return "active for " + e.Model
	case "previous":
		return "previous activation of " + e.Model + " (what a rollback returns to)"
	case "floor":
		return "the configured policy of " + e.Model + " (where its rollbacks stop)"
	case "legacy-active":
		return "the store names it active for " + e.Model
	}
	return e.Role + " of " + e.Model
}

// ExplainEndpoint is one candidate in POST /admin/v1/route.
type ExplainEndpoint struct {
	ID                 string  `json:"id"`
	Rank               int     `json:"rank"` // 0-based position in the policy's ranking
	GPUBlocks          int     `json:"gpu_blocks"`
	CPUBlocks          int     `json:"cpu_blocks"`
	MatchRate          float64 `json:"match_rate"` // (GPU + 0.8·CPU blocks)·block_size / prompt tokens
	Waiting            float64 `json:"waiting"`
	Running            float64 `json:"running"`
	KVCacheUtilization float64 `json:"kv_cache_utilization"`
	InFlightRequests   int64   `json:"inflight_requests"`
	InFlightTokens     int64   `json:"inflight_tokens"`
	MaxInflightReqs    int64   `json:"max_inflight_requests"`
	MaxInflightTokens  int64   `json:"max_inflight_tokens"`
	HasCapacity        bool    `json:"has_capacity"`
}

// ExplainResponse is the body of POST /admin/v1/route.
type ExplainResponse struct {
	Model        string             `json:"model"`
	LoRA         string             `json:"lora,omitempty"`
	API          string             `json:"api"`
	PromptTokens int                `json:"prompt_tokens"`
	BlockSize    int                `json:"block_size"`
	Blocks       int                `json:"blocks"`
	Policy       string             `json:"policy"`
	Fallback     string             `json:"fallback,omitempty"`
	LoadOnly     bool               `json:"load_only"`
	Endpoints    []ExplainEndpoint  `json:"endpoints"`
	Ranking      []string           `json:"ranking"`
	Chosen       string             `json:"chosen"` // first ranked endpoint with capacity now ("" if none)
	StagesMicros map[string]float64 `json:"stages_us"`
}

func (a *API) explain(c *fiber.Ctx) error {
	body := append([]byte(nil), c.Body()...)
	api := openai.Completions
	if strings.Contains(c.Query("api"), "chat") || jsonHas(body, "messages") {
		api = openai.Chat
	}
	req, err := openai.ParseRequest(api, body)
	if err != nil {
		var oe *openai.Error
		errors.As(err, &oe)
		return fail(c, oe)
	}
	sm, ok := a.Models[req.Model]
	if !ok {
		return fail(c, openai.ModelNotFound(req.Model))
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), 5*time.Second)
	defer cancel()
	p, err := a.Router.Plan(ctx, sm.Model, sm.LoRA, server.RouteRequest(req), body)
	if err != nil {
		return fail(c, server.RouteError(req.Model, err))
	}
	a.Router.CompleteRanking(ctx, p) // every endpoint's rank, not the first few the router asks for
	out := ExplainResponse{Model: sm.Model.Name, LoRA: sm.LoRA, API: api.String(), PromptTokens: len(p.IDs),
		BlockSize: sm.Model.BlockSize, Blocks: len(p.Keys), Policy: p.Info.Policy, Fallback: p.Info.Fallback,
		LoadOnly: p.LoadOnly, StagesMicros: map[string]float64{}}
	rank := make([]int, len(p.Candidates))
	for pos, i := range p.Ranking {
		rank[i] = pos
	}
	cost := a.Router.Cost(p)
	for i, cd := range p.Candidates {
		room := (cd.Limits.MaxRequests == 0 || cd.InFlight.Requests+cost.Requests <= cd.Limits.MaxRequests) &&
			(cd.Limits.MaxTokens == 0 || cd.InFlight.Tokens == 0 || cd.InFlight.Tokens+cost.Tokens <= cd.Limits.MaxTokens)
		out.Endpoints = append(out.Endpoints, ExplainEndpoint{ID: cd.ID, Rank: rank[i], GPUBlocks: cd.GPUBlocks,
			CPUBlocks: cd.CPUBlocks,
			MatchRate: plugins.ThreeTierMatchRate(uint32(cd.GPUBlocks), uint32(cd.CPUBlocks), uint32(sm.Model.BlockSize),
				uint32(len(p.IDs)), plugins.DefaultThreeTierConfig().CPUWeight),
			Waiting: cd.Load.Waiting, Running: cd.Load.Running, KVCacheUtilization: cd.Load.KVCacheUsage,
			InFlightRequests: cd.InFlight.Requests, InFlightTokens: cd.InFlight.Tokens,
			MaxInflightReqs: cd.Limits.MaxRequests, MaxInflightTokens: cd.Limits.MaxTokens, HasCapacity: room})
	}
	for _, i := range p.Ranking {
		out.Ranking = append(out.Ranking, p.Candidates[i].ID)
		if out.Chosen == "" && out.Endpoints[i].HasCapacity {
			out.Chosen = p.Candidates[i].ID
		}
	}
	for k, d := range p.Stages {
		out.StagesMicros[k] = float64(d.Nanoseconds()) / 1e3
	}
	return c.JSON(out)
}

// jsonHas reports whether the top-level object has key.
func jsonHas(body []byte, key string) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return false
	}
	_, ok := m[key]
	return ok
}
