package gateway

import (
	"github.com/gofiber/fiber/v2"

	"github.com/kvgate/kvgate/gateway/internal/admin"
)

// mountAdmin mounts the admin API on the server's /admin/v1 group.
func (g *Gateway) mountAdmin(r fiber.Router) {
	models := map[string]admin.Model{}
	for name, sm := range g.models {
		models[name] = admin.Model{Model: sm.Model, LoRA: sm.LoRA}
	}
	var names []string
	for _, m := range g.cfg.Models {
		names = append(names, m.Name)
	}
	a := &admin.API{Host: g.host, Sync: g.policySync, Router: g.router, Models: models, ModelNames: names,
		MaxPolicyBytes: g.cfg.MaxPolicyBytes}
	a.Mount(r)
	(&admin.Endpoints{Ops: g.epSync}).Mount(r)
	if g.tpu != nil {
		(&admin.TPU{Alloc: g.tpu}).Mount(r)
	}
}
