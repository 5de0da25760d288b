package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/openai"
)

// Errors an EndpointOps returns (wrapped; matched with errors.Is).
var (
	// ErrEndpointNotFound: no endpoint with that ID in the fleet (404 endpoint_not_found).
	ErrEndpointNotFound = errors.New("admin: no such endpoint")
	// ErrEndpointConflict: the ID is taken by an endpoint of another model, or the endpoint is being
	// removed (409 endpoint_conflict).
	ErrEndpointConflict = errors.New("admin: endpoint conflict")
	// ErrUnknownModel: the model is not served by this gateway's configuration (404 model_not_found).
	ErrUnknownModel = errors.New("admin: unknown model")
)

// EndpointView is one run-time endpoint as the admin API shows it.
type EndpointView struct {
	ID    string `json:"id"`
	Model string `json:"model"`
	// Endpoint is its configuration, with the config file's endpoint keys.
	Endpoint json.RawMessage `json:"endpoint"`
	// State is active, draining or drained; Removing is set on a draining endpoint whose record goes once
	// drained.
	State    string `json:"state"`
	Removing bool   `json:"removing,omitempty"`
	// Source is config, admin, dns:<name> or simulate.
	Source string `json:"source,omitempty"`
	// DrainSince is when draining started (RFC 3339), "" unless draining.
	DrainSince string `json:"drain_since,omitempty"`
	// Here is this gateway's view: healthy (last probe), routed (a routing candidate now), ingesting (this
	// gateway holds its KV-event lease), error (why it does not run here, e.g. an unknown model).
	Here *EndpointHere `json:"here,omitempty"`
}

// EndpointHere is what one gateway runs of an endpoint.
type EndpointHere struct {
	Healthy   bool   `json:"healthy"`
	Routed    bool   `json:"routed"`
	Ingesting bool   `json:"ingesting"`
	Error     string `json:"error,omitempty"`
}

// EndpointList is GET /admin/v1/endpoints.
type EndpointList struct {
	// Revision is the store's revision of the endpoint set.
	Revision uint64 `json:"revision"`
	// Endpoints are sorted by ID.
	Endpoints []EndpointView `json:"endpoints"`
	// ConfigMismatch lists how this gateway's config file disagrees with the store (empty: it agrees).
	ConfigMismatch []string `json:"config_mismatch"`
}

// EndpointOps are the run-time endpoint operations (the gateway's endpoint follower): each is one atomic
// write to the store, which every gateway follows.
type EndpointOps interface {
	ListEndpoints(ctx context.Context) (EndpointList, error)
	// PutEndpoint adds e to model's endpoints, or changes it (created=false) when its ID exists; a draining
	// or drained endpoint becomes active again.
	PutEndpoint(ctx context.Context, model string, e config.Endpoint) (v EndpointView, created bool, err error)
	// DrainEndpoint stops new requests to id; once its in-flight leases end it is drained (kept, inactive).
	DrainEndpoint(ctx context.Context, id string) (EndpointView, error)
	// DeleteEndpoint drains id and removes it once drained.
	DeleteEndpoint(ctx context.Context, id string) (EndpointView, error)
}

// Endpoints is the run-time endpoint admin API, mounted on the /admin/v1 group (behind its bearer-token
// middleware). JSON in and out; errors in the OpenAI error shape:
//
//	GET    /admin/v1/endpoints              → 200 EndpointList
//	POST   /admin/v1/endpoints              {"model", <endpoint keys>...} → 201 (added) or 200 (changed) EndpointView
//	POST   /admin/v1/endpoints/{id}/drain   → 202 EndpointView (state draining)
//	DELETE /admin/v1/endpoints/{id}         → 202 EndpointView (state draining, removing)
//
// 400 invalid_endpoint (a bad key or value, named in param), 404 endpoint_not_found / model_not_found,
// 409 endpoint_conflict, 503 store_unavailable.
type Endpoints struct {
	Ops EndpointOps
}

// Mount adds the routes to r.
func (a *Endpoints) Mount(r fiber.Router) {
	r.Get("/endpoints", a.list)
	r.Post("/endpoints", a.put)
	r.Post("/endpoints/:id/drain", a.drain)
	r.Delete("/endpoints/:id", a.remove)
}

func endpointError(c *fiber.Ctx, err error) error {
	var ce *config.Error
	switch {
	case errors.As(err, &ce):
		return fail(c, openai.Errorf(http.StatusBadRequest, "invalid_request_error", ce.Key, "invalid_endpoint", "%s", err.Error()))
	case errors.Is(err, ErrEndpointNotFound):
		return fail(c, openai.Errorf(http.StatusNotFound, "invalid_request_error", "id", "endpoint_not_found", "%s", err.Error()))
	case errors.Is(err, ErrUnknownModel):
		return fail(c, openai.Errorf(http.StatusNotFound, "invalid_request_error", "model", "model_not_found", "%s", err.Error()))
	case errors.Is(err, ErrEndpointConflict):
		return fail(c, openai.Errorf(http.StatusConflict, "invalid_request_error", "id", "endpoint_conflict", "%s", err.Error()))
	}
	return fail(c, openai.Errorf(http.StatusServiceUnavailable, "server_error", "", "store_unavailable", "%s", err.Error()))
}

func (a *Endpoints) list(c *fiber.Ctx) error {
	ctx, cancel := tctx(c)
	defer cancel()
	l, err := a.Ops.ListEndpoints(ctx)
	if err != nil {
		return endpointError(c, err)
	}
	return c.JSON(l)
}

func (a *Endpoints) put(c *fiber.Ctx) error {
	var body map[string]json.RawMessage
	if e := decode(c, &body); e != nil {
		return fail(c, e)
	}
	var model string
	if raw, ok := body["model"]; !ok || json.Unmarshal(raw, &model) != nil || model == "" {
		return fail(c, openai.Errorf(http.StatusBadRequest, "invalid_request_error", "model", "invalid_endpoint",
			"the body needs \"model\" (a served model name) beside the endpoint's keys"))
	}
	delete(body, "model")
	raw, _ := json.Marshal(body)
	e, err := config.ParseEndpoint(raw)
	if err != nil {
		return endpointError(c, err)
	}
	ctx, cancel := tctx(c)
	defer cancel()
	v, created, err := a.Ops.PutEndpoint(ctx, model, e)
	if err != nil {
		return endpointError(c, err)
	}
	if created {
		c.Status(http.StatusCreated)
	}
	return c.JSON(v)
}

func (a *Endpoints) drain(c *fiber.Ctx) error {
	ctx, cancel := tctx(c)
	defer cancel()
	v, err := a.Ops.DrainEndpoint(ctx, param(c, "id"))
	if err != nil {
		return endpointError(c, err)
	}
	return c.Status(http.StatusAccepted).JSON(v)
}

func (a *Endpoints) remove(c *fiber.Ctx) error {
	ctx, cancel := tctx(c)
	defer cancel()
	v, err := a.Ops.DeleteEndpoint(ctx, param(c, "id"))
	if err != nil {
		return endpointError(c, err)
	}
	return c.Status(http.StatusAccepted).JSON(v)
}
