package gateway

import "github.com/kvgate/kvgate/gateway/internal/admin"

// The admin API's JSON bodies (README.md, "Admin API and policies"), for programs that call a running gateway's
// /admin/v1 routes: the process harness of the benchmark and the end-to-end tests
// (cmd/kvgate-bench/harness). Each is the type the gateway encodes or decodes, so a client decodes the
// same fields.
type (
	// AdminUploadResponse is the answer to PUT /admin/v1/policies/{name}: the version and its validation
	// report.
	AdminUploadResponse = admin.UploadResponse
	// AdminListResponse is the answer to GET /admin/v1/policies: every loaded version, the active policy
	// of each model and, with a shared store, the fleet's view.
	AdminListResponse = admin.ListResponse
	// AdminVersion is one loaded policy version in an AdminListResponse.
	AdminVersion = admin.VersionJSON
	// AdminActivateRequest is the body of POST /admin/v1/policies/activate.
	AdminActivateRequest = admin.ActivateRequest
	// AdminExplainResponse is the answer to POST /admin/v1/route: the routing decision without forwarding.
	AdminExplainResponse = admin.ExplainResponse
)
