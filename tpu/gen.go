package tpu

import (
	"fmt"
	"strings"
)

// TableVersion names this revision of the generation table; bump it when a row changes.
const TableVersion = "2026-12-01.1"

const gib = int64(1) << 30

// Generation is one TPU generation's static facts.
type Generation struct {
	Name               string   // canonical name: v4, v5litepod, v5p, v6e, tpu7x
	Aliases            []string // other accepted spellings (v5e, v7x)
	Dims               int      // 2 (v5e, v6e) or 3
	TensorCoresPerChip int
	DevicesPerChip     int   // PJRT devices per chip by default (1)
	MaxDevicesPerChip  int   // tpu7x may expose each chiplet as a device (2)
	HBMBytesPerChip    int64 // bytes
	PodTypePrefix      string
	GKEAccelerator     string // value of the cloud.google.com/gke-tpu-accelerator node label
	shapes             []Shape
}

// PodType is the accelerator type of chips chips: prefix + "-" + TensorCores (v6e-16, v5p-32, tpu7x-128).
func (g *Generation) PodType(chips int) string {
	return fmt.Sprintf("%s-%d", g.PodTypePrefix, chips*g.TensorCoresPerChip)
}

// ValidShapes returns the generation's valid slice shapes.
func (g *Generation) ValidShapes() []Shape { return append([]Shape(nil), g.shapes...) }

// Valid reports whether s is a valid slice shape of g (same dimensionality, listed; no rotation).
func (g *Generation) Valid(s Shape) bool {
	for _, v := range g.shapes {
		if v == s {
			return true
		}
	}
	return false
}

func shapes(list ...string) []Shape {
	out := make([]Shape, 0, len(list))
	for _, s := range list {
		sh, err := ParseShape(s)
		if err != nil {
			panic(err)
		}
		out = append(out, sh)
	}
	return out
}

// larger3D is Ray's _get_larger_3d_topologies: every AxBxC with each extent a multiple of 4 up to the
// maxima (unsorted: 4x4x8 and 8x4x4 are both valid).
func larger3D(base []Shape, mx, my, mz int) []Shape {
	out := base
	for x := 4; x <= mx; x += 4 {
		for y := 4; y <= my; y += 4 {
			for z := 4; z <= mz; z += 4 {
				out = append(out, Shape{N: 3, D: [3]int{x, y, z}})
			}
		}
	}
	return out
}

// HBM per chip, resolved to bytes from each generation's Google Cloud page. Where a page writes "GB" for
// what the TPU7x page's comparison table labels "(GiB)" (v6e 32, v5p 95, TPU7x 192), we take GiB: HBM is
// sold in binary stack sizes, and the v6e page compares v5e's 16 in the same column as v6e's 32.
var generations = []*Generation{
	{
		// https://cloud.google.com/tpu/docs/v4: "32 GiB of HBM2" per chip, 2 TensorCores.
		Name: "v4", Dims: 3, TensorCoresPerChip: 2, DevicesPerChip: 1, MaxDevicesPerChip: 1,
		HBMBytesPerChip: 32 * gib, PodTypePrefix: "v4", GKEAccelerator: "tpu-v4-podslice",
		shapes: larger3D(shapes("2x2x1", "2x2x2", "2x2x4", "2x4x4"), 12, 12, 16),
	},
	{
		// https://cloud.google.com/tpu/docs/v5e: "HBM2 capacity 16 GB"; https://cloud.google.com/tpu/docs/v6e
		// lists v5e 16 beside v6e 32 in one column, which the TPU7x page labels GiB: 16 GiB.
		Name: "v5litepod", Aliases: []string{"v5e"}, Dims: 2, TensorCoresPerChip: 1, DevicesPerChip: 1, MaxDevicesPerChip: 1,
		HBMBytesPerChip: 16 * gib, PodTypePrefix: "v5litepod", GKEAccelerator: "tpu-v5-lite-podslice",
		shapes: shapes("1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"),
	},
	{
		// https://cloud.google.com/tpu/docs/v5p: "HBM capacity per chip (GiB) 95", 2 TensorCores.
		Name: "v5p", Dims: 3, TensorCoresPerChip: 2, DevicesPerChip: 1, MaxDevicesPerChip: 1,
		HBMBytesPerChip: 95 * gib, PodTypePrefix: "v5p", GKEAccelerator: "tpu-v5p-slice",
		shapes: larger3D(shapes("2x2x1", "2x2x2", "2x2x4", "2x4x4"), 16, 16, 24),
	},
	{
		// https://cloud.google.com/tpu/docs/tpu7x comparison table "HBM capacity per chip (GiB)": v6e 32
		// (the v6e page itself writes "32 GB"). 1 TensorCore.
		Name: "v6e", Dims: 2, TensorCoresPerChip: 1, DevicesPerChip: 1, MaxDevicesPerChip: 1,
		HBMBytesPerChip: 32 * gib, PodTypePrefix: "v6e", GKEAccelerator: "tpu-v6e-slice",
		shapes: shapes("1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"),
	},
	{
		// https://cloud.google.com/tpu/docs/tpu7x: "HBM capacity per chip (GiB) 192", 2 TensorCores; the
		// dual-chiplet chip may be exposed as 2 devices (Ray PR #64058).
		Name: "tpu7x", Aliases: []string{"v7x"}, Dims: 3, TensorCoresPerChip: 2, DevicesPerChip: 1, MaxDevicesPerChip: 2,
		HBMBytesPerChip: 192 * gib, PodTypePrefix: "tpu7x", GKEAccelerator: "tpu7x",
		shapes: shapes("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"),
	},
}

// LookupGeneration finds a generation by name or alias (case-insensitive).
func LookupGeneration(name string) (*Generation, bool) {
	n := strings.ToLower(strings.TrimSpace(name))
	for _, g := range generations {
		if g.Name == n {
			return g, true
		}
		for _, a := range g.Aliases {
			if a == n {
				return g, true
			}
		}
	}
	return nil, false
}
