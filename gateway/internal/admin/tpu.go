package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/tpu"
)

// TPU is the TPU allocator's admin API, mounted on the same /admin/v1 group (so behind the same bearer-token
// middleware) as the policy routes. JSON in and out; refusals use the OpenAI error shape with the tpu
// refusal code (no_capacity, invalid_shape, misaligned, below_host_granularity, exceeds_parent,
// use_whole_slice, invalid_index, stale_token, lease_not_found, unknown_slice, slice_exists,
// invalid_argument):
//
//	GET  /admin/v1/tpu/pools                                     {"pools":[...]}
//	GET  /admin/v1/tpu/pools/{pool}                              tpu.PoolInfo
//	POST /admin/v1/tpu/pools/{pool}/slices                       tpu.SliceSpec → 201 tpu.SliceInfo
//	GET  /admin/v1/tpu/pools/{pool}/slices/{slice}               tpu.SliceInfo with per-chip owners
//	POST /admin/v1/tpu/pools/{pool}/slices/{slice}/health        {"host","healthy"} → 200 tpu.SliceInfo
//	POST /admin/v1/tpu/pools/{pool}/leases                       LeaseRequest → 201 tpu.Lease
//	POST /admin/v1/tpu/pools/{pool}/leases/{lease}/renew         {"token","ttl"} → 200 tpu.Lease
//	POST /admin/v1/tpu/pools/{pool}/leases/{lease}/release       {"token"} → 200 {"lease_id","released"}
type TPU struct {
	Alloc *tpu.Allocator
}

// LeaseRequest is the body of POST .../leases: tpu.Request with the TTL as a Go duration string ("30s").
type LeaseRequest struct {
	tpu.Request
	TTL string `json:"ttl"`
}

// Mount adds the routes to r (the /admin/v1 group).
func (a *TPU) Mount(r fiber.Router) {
	g := r.Group("/tpu")
	g.Get("/pools", a.pools)
	g.Get("/pools/:pool", a.list)
	g.Post("/pools/:pool/slices", a.register)
	g.Get("/pools/:pool/slices/:slice", a.inspect)
	g.Post("/pools/:pool/slices/:slice/health", a.health)
	g.Post("/pools/:pool/leases", a.reserve)
	g.Post("/pools/:pool/leases/:lease/renew", a.renew)
	g.Post("/pools/:pool/leases/:lease/release", a.release)
}

// tpuError maps an allocator error to the OpenAI error shape: 404 for unknown slices and leases, 409 for
// no capacity, stale tokens and conflicting registrations, 400 for other refusals, 503 when the store fails.
func tpuError(c *fiber.Ctx, err error) error {
	code := tpu.Code(err)
	status := http.StatusBadRequest
	typ := "invalid_request_error"
	switch code {
	case "":
		return fail(c, openai.Errorf(http.StatusServiceUnavailable, "server_error", "", "store_unavailable", "%s", err.Error()))
	case "unknown_slice", "lease_not_found":
		status = http.StatusNotFound
	case "no_capacity", "stale_token", "slice_exists":
		status = http.StatusConflict
	}
	return fail(c, openai.Errorf(status, typ, "", code, "%s", err.Error()))
}

func param(c *fiber.Ctx, name string) string {
	v, err := url.PathUnescape(c.Params(name))
	if err != nil {
		return c.Params(name)
	}
	return v
}

func tctx(c *fiber.Ctx) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.UserContext(), 10*time.Second)
}

func decode(c *fiber.Ctx, v any) *openai.Error {
	if err := json.Unmarshal(c.Body(), v); err != nil {
		return openai.Errorf(http.StatusBadRequest, "invalid_request_error", "", "invalid_argument", "invalid JSON body: %v", err)
	}
	return nil
}

func (a *TPU) pools(c *fiber.Ctx) error {
	ctx, cancel := tctx(c)
	defer cancel()
	p, err := a.Alloc.Pools(ctx)
	if err != nil {
		return tpuError(c, err)
	}
	if p == nil {
		p = []string{}
	}
	return c.JSON(fiber.Map{"pools": p})
}

func (a *TPU) list(c *fiber.Ctx) error {
	ctx, cancel := tctx(c)
	defer cancel()
	info, err := a.Alloc.List(ctx, param(c, "pool"))
	if err != nil {
		return tpuError(c, err)
	}
	return c.JSON(info)
}

func (a *TPU) register(c *fiber.Ctx) error {
	var spec tpu.SliceSpec
	if e := decode(c, &spec); e != nil {
		return fail(c, e)
	}
	ctx, cancel := tctx(c)
	defer cancel()
	pool := param(c, "pool")
	if err := a.Alloc.Register(ctx, pool, spec); err != nil {
		return tpuError(c, err)
	}
	si, err := a.Alloc.Inspect(ctx, pool, spec.ID)
	if err != nil {
		return tpuError(c, err)
	}
	return c.Status(http.StatusCreated).JSON(si)
}

func (a *TPU) inspect(c *fiber.Ctx) error {
	ctx, cancel := tctx(c)
	defer cancel()
	si, err := a.Alloc.Inspect(ctx, param(c, "pool"), param(c, "slice"))
	if err != nil {
		return tpuError(c, err)
	}
	return c.JSON(si)
}

func (a *TPU) health(c *fiber.Ctx) error {
	var body struct {
		Host    string `json:"host"`
		Healthy *bool  `json:"healthy"`
	}
	if e := decode(c, &body); e != nil {
		return fail(c, e)
	}
	if body.Host == "" || body.Healthy == nil {
		return fail(c, openai.Errorf(http.StatusBadRequest, "invalid_request_error", "", "invalid_argument", `body needs "host" and "healthy"`))
	}
	ctx, cancel := tctx(c)
	defer cancel()
	pool, slice := param(c, "pool"), param(c, "slice")
	if err := a.Alloc.SetHealth(ctx, pool, slice, body.Host, *body.Healthy); err != nil {
		return tpuError(c, err)
	}
	si, err := a.Alloc.Inspect(ctx, pool, slice)
	if err != nil {
		return tpuError(c, err)
	}
	return c.JSON(si)
}

func parseTTL(s string) (time.Duration, *openai.Error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, (openai.Errorf(http.StatusBadRequest, "invalid_request_error", "ttl", "invalid_argument", "ttl %q: want a duration such as \"30s\"", s))
	}
	return d, nil
}

func (a *TPU) reserve(c *fiber.Ctx) error {
	var body LeaseRequest
	if e := decode(c, &body); e != nil {
		return fail(c, e)
	}
	ttl, e := parseTTL(body.TTL)
	if e != nil {
		return fail(c, e)
	}
	req := body.Request
	req.TTL = ttl
	ctx, cancel := tctx(c)
	defer cancel()
	l, err := a.Alloc.Reserve(ctx, param(c, "pool"), req)
	if err != nil {
		return tpuError(c, err)
	}
	return c.Status(http.StatusCreated).JSON(l)
}

type tokenBody struct {
	Token int64  `json:"token"`
	TTL   string `json:"ttl"`
}

func (a *TPU) renew(c *fiber.Ctx) error {
	var body tokenBody
	if e := decode(c, &body); e != nil {
		return fail(c, e)
	}
	ttl, e := parseTTL(body.TTL)
	if e != nil {
		return fail(c, e)
	}
	ctx, cancel := tctx(c)
	defer cancel()
	l, err := a.Alloc.Renew(ctx, param(c, "pool"), param(c, "lease"), body.Token, ttl)
	if err != nil {
		return tpuError(c, err)
	}
	return c.JSON(l)
}

func (a *TPU) release(c *fiber.Ctx) error {
	var body tokenBody
	if e := decode(c, &body); e != nil {
		return fail(c, e)
	}
	ctx, cancel := tctx(c)
	defer cancel()
	id := param(c, "lease")
	ok, err := a.Alloc.Release(ctx, param(c, "pool"), id, body.Token)
	if err != nil {
		return tpuError(c, err)
	}
	return c.JSON(fiber.Map{"lease_id": id, "released": ok})
}
