// Package tpu reserves whole TPU slices and aligned sub-slices for gangs of hosts, on the gateway's store
// (memory, or Redis / Redis Cluster), with expiring leases carrying fencing tokens. See README.md for the
// model and a worked example, RATIONALE.md for the decisions.
//
// Conventions: a topology "AxB[xC]" gives chip extents along X, Y[, Z]; chip coordinates are [x,y(,z)];
// linear indexes (chips, hosts, candidate tiles) are X-minor; shapes are never rotated. A host (VM) holds a
// 2x2 (2D) or 2x2x1 (3D) block of chips, or the whole slice when the slice is single-host.
package tpu

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Typed refusals. Every error an Allocator returns for a refusal wraps exactly one of these; Code maps it
// to the snake_case code the HTTP API and CLI print.
var (
	ErrInvalidShape         = errors.New("invalid shape")
	ErrMisaligned           = errors.New("offset not aligned to the shape")
	ErrBelowHostGranularity = errors.New("shape below host granularity")
	ErrShapeExceedsParent   = errors.New("shape exceeds the parent slice")
	ErrUseWholeSlice        = errors.New("shape is the whole slice: reserve the slice instead")
	ErrInvalidIndex         = errors.New("invalid sub-slice index")
	ErrNoCapacity           = errors.New("no capacity")
	ErrStaleToken           = errors.New("stale fencing token")
	ErrLeaseNotFound        = errors.New("lease not found")
	ErrUnknownSlice         = errors.New("unknown slice")
	ErrSliceExists          = errors.New("slice exists with another spec")
	ErrInvalidArgument      = errors.New("invalid argument")
)

var codes = []struct {
	err  error
	code string
}{
	{ErrInvalidShape, "invalid_shape"}, {ErrMisaligned, "misaligned"}, {ErrBelowHostGranularity, "below_host_granularity"},
	{ErrShapeExceedsParent, "exceeds_parent"}, {ErrUseWholeSlice, "use_whole_slice"}, {ErrInvalidIndex, "invalid_index"},
	{ErrNoCapacity, "no_capacity"}, {ErrStaleToken, "stale_token"}, {ErrLeaseNotFound, "lease_not_found"},
	{ErrUnknownSlice, "unknown_slice"}, {ErrSliceExists, "slice_exists"}, {ErrInvalidArgument, "invalid_argument"},
}

// Code returns err's snake_case refusal code ("no_capacity", ...), or "" for a non-refusal (store) error.
func Code(err error) string {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return ""
}

// codeErr maps a script's code back to its sentinel.
func codeErr(code string) error {
	for _, c := range codes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// Strategy selects sub-slice placement.
type Strategy string

const (
	// BestFit (the default) fills partly used slices first (fewest free chips), and within a slice the tile
	// whose enclosing larger aligned blocks are the most used, smallest block first, so large aligned blocks
	// stay free (as a buddy allocator does). Ties go to the lowest slice ID, then the lowest index.
	BestFit Strategy = "best-fit"
	// FirstFit takes the first free tile in slice-ID, then index order.
	FirstFit Strategy = "first-fit"
)

// Host is one TPU VM of a slice.
type Host struct {
	Name     string `json:"name"`
	WorkerID int    `json:"worker_id"` // 0..hosts-1; worker 0 is the head
}

// SliceSpec registers a slice.
type SliceSpec struct {
	ID         string `json:"id"`         // [A-Za-z0-9_-]{1,64}
	Generation string `json:"generation"` // a generation name or alias (v6e, v5e, v7x, ...)
	Topology   string `json:"topology"`   // e.g. "4x4", "4x4x4": a valid shape of the generation
	Hosts      []Host `json:"hosts"`      // one per VM; worker IDs a permutation of 0..n-1
	// DevicesPerChip overrides the generation's default (tpu7x may use 2); 0 = default.
	DevicesPerChip int `json:"devices_per_chip,omitempty"`
}

// sliceRec is the stored, normalized form of a slice: the spec plus what placement needs (the Lua scripts
// read the same JSON).
type sliceRec struct {
	ID      string   `json:"id"`
	Gen     string   `json:"gen"`
	Topo    string   `json:"topo"`
	Hosts   []string `json:"hosts"` // by worker ID
	Devices int      `json:"dpc"`
	N       int      `json:"nd"`
	D       [3]int   `json:"d"`
	HB      [3]int   `json:"hb"` // host block
	HG      [3]int   `json:"hg"` // host grid
	Single  bool     `json:"single"`
	VS      [][3]int `json:"vs"` // valid shapes of the generation with N dims
	shape   Shape
	gen     *Generation
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func checkName(kind, s string) error {
	if !idRE.MatchString(s) {
		return fmt.Errorf("tpu: %s %q: want [A-Za-z0-9_-]{1,64}: %w", kind, s, ErrInvalidArgument)
	}
	return nil
}

// newSliceRec validates spec: known generation, valid topology, the host count the topology needs (1 for
// 1x1/2x2/2x2x1; 1 or 2 for 2x4; else one per 4 chips), unique names, worker IDs 0..n-1.
func newSliceRec(spec SliceSpec) (*sliceRec, error) {
	if err := checkName("slice", spec.ID); err != nil {
		return nil, err
	}
	g, ok := LookupGeneration(spec.Generation)
	if !ok {
		return nil, fmt.Errorf("tpu: slice %s: unknown generation %q: %w", spec.ID, spec.Generation, ErrInvalidArgument)
	}
	sh, err := ParseShape(spec.Topology)
	if err != nil {
		return nil, err
	}
	if sh.N != g.Dims || !g.Valid(sh) {
		return nil, fmt.Errorf("tpu: slice %s: %s is not a %s topology: %w", spec.ID, sh, g.Name, ErrInvalidShape)
	}
	r := &sliceRec{ID: spec.ID, Gen: g.Name, Topo: sh.String(), N: sh.N, D: sh.D, shape: sh, gen: g, Devices: spec.DevicesPerChip}
	if r.Devices == 0 {
		r.Devices = g.DevicesPerChip
	}
	if r.Devices < 1 || r.Devices > g.MaxDevicesPerChip {
		return nil, fmt.Errorf("tpu: slice %s: %d devices per chip (%s allows 1..%d): %w", spec.ID, r.Devices, g.Name, g.MaxDevicesPerChip, ErrInvalidArgument)
	}
	n := len(spec.Hosts)
	chips := sh.Chips()
	switch {
	case chips <= 4 || (chips == 8 && sh.N == 2 && n == 1):
		if n != 1 {
			return nil, fmt.Errorf("tpu: slice %s: %s is single-host, got %d hosts: %w", spec.ID, sh, n, ErrInvalidArgument)
		}
		r.HB, r.Single = sh.D, true
	default:
		if n*4 != chips {
			return nil, fmt.Errorf("tpu: slice %s: %s needs %d hosts of 4 chips, got %d: %w", spec.ID, sh, chips/4, n, ErrInvalidArgument)
		}
		r.HB = [3]int{2, 2, 1}
	}
	for i := range 3 {
		r.HG[i] = r.D[i] / r.HB[i]
	}
	r.Hosts = make([]string, n)
	seen := map[string]bool{}
	for _, h := range spec.Hosts {
		if h.Name == "" || strings.ContainsAny(h.Name, ", \t\n") || seen[h.Name] {
			return nil, fmt.Errorf("tpu: slice %s: host name %q empty, repeated or with a comma/space: %w", spec.ID, h.Name, ErrInvalidArgument)
		}
		if h.WorkerID < 0 || h.WorkerID >= n || r.Hosts[h.WorkerID] != "" {
			return nil, fmt.Errorf("tpu: slice %s: worker IDs must be 0..%d, each once: %w", spec.ID, n-1, ErrInvalidArgument)
		}
		seen[h.Name] = true
		r.Hosts[h.WorkerID] = h.Name
	}
	for _, v := range g.shapes {
		r.VS = append(r.VS, v.D)
	}
	return r, nil
}

// finish restores the unexported fields after decoding.
func (r *sliceRec) finish() error {
	g, ok := LookupGeneration(r.Gen)
	if !ok {
		return fmt.Errorf("tpu: stored slice %s: generation %q", r.ID, r.Gen)
	}
	r.gen, r.shape = g, Shape{N: r.N, D: r.D}
	return nil
}

// worker returns the worker ID that holds chip c.
func (r *sliceRec) worker(c [3]int) int {
	return c[0]/r.HB[0] + (c[1]/r.HB[1])*r.HG[0] + (c[2]/r.HB[2])*r.HG[0]*r.HG[1]
}

// Request asks for a lease.
type Request struct {
	// Shape is the sub-slice shape ("2x2"), or with Whole the slice topology to take ("" with Slice set:
	// that slice, whatever its topology).
	Shape string `json:"shape"`
	// Whole reserves a whole idle slice (the lowest ID among those of Shape's topology).
	Whole  bool          `json:"whole,omitempty"`
	Holder string        `json:"holder"` // who holds the lease (free text, 1..256 bytes)
	TTL    time.Duration `json:"-"`      // lease lifetime, 1 ms..24 h; renew before it ends
	// Slice restricts placement to one slice.
	Slice string `json:"slice,omitempty"`
	// Index, if set, asks for that tile (X-minor over the tile grid of the parent).
	Index *int `json:"index,omitempty"`
	// Offset, if set, asks for the tile at that chip offset (each extent a multiple of the shape's).
	Offset []int `json:"offset,omitempty"`
	// Strategy is BestFit when empty.
	Strategy Strategy `json:"strategy,omitempty"`
	// AllowSubHost permits shapes below the host block on a single-host slice (several holders share a VM).
	AllowSubHost bool `json:"allow_sub_host,omitempty"`
}

// request is a validated Request in the form placement (Go and Lua) takes.
type request struct {
	Whole    bool   `json:"whole"`
	Any      bool   `json:"any"` // whole without a topology
	N        int    `json:"nd"`
	S        [3]int `json:"s"`
	Holder   string `json:"holder"`
	TTLms    int64  `json:"ttl"`
	Slice    string `json:"slice"`
	Index    int    `json:"index"` // -1: none
	HasOff   bool   `json:"hasoff"`
	Off      [3]int `json:"off"`
	First    bool   `json:"first"`
	SubHost  bool   `json:"subhost"`
	shapeStr string
}

func msCeil(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func checkTTL(ttl time.Duration) error {
	if ttl < time.Millisecond || ttl > 24*time.Hour {
		return fmt.Errorf("tpu: ttl %v: want 1ms..24h: %w", ttl, ErrInvalidArgument)
	}
	return nil
}

func newRequest(r Request) (*request, error) {
	q := &request{Whole: r.Whole, Holder: r.Holder, TTLms: msCeil(r.TTL), Slice: r.Slice, Index: -1,
		First: r.Strategy == FirstFit, SubHost: r.AllowSubHost}
	if err := checkTTL(r.TTL); err != nil {
		return nil, err
	}
	if r.Holder == "" || len(r.Holder) > 256 {
		return nil, fmt.Errorf("tpu: holder must be 1..256 bytes: %w", ErrInvalidArgument)
	}
	if r.Strategy != "" && r.Strategy != BestFit && r.Strategy != FirstFit {
		return nil, fmt.Errorf("tpu: strategy %q (want best-fit or first-fit): %w", r.Strategy, ErrInvalidArgument)
	}
	if r.Slice != "" {
		if err := checkName("slice", r.Slice); err != nil {
			return nil, err
		}
	}
	if r.Whole && r.Shape == "" {
		if r.Slice == "" {
			return nil, fmt.Errorf("tpu: a whole-slice request needs a topology or a slice: %w", ErrInvalidArgument)
		}
		q.Any = true
	} else {
		sh, err := ParseShape(r.Shape)
		if err != nil {
			return nil, err
		}
		q.N, q.S, q.shapeStr = sh.N, sh.D, sh.String()
	}
	if r.Whole && (r.Index != nil || r.Offset != nil) {
		return nil, fmt.Errorf("tpu: index and offset are for sub-slices: %w", ErrInvalidArgument)
	}
	if r.Index != nil {
		if *r.Index < 0 {
			return nil, fmt.Errorf("tpu: index %d: %w", *r.Index, ErrInvalidIndex)
		}
		q.Index = *r.Index
	}
	if r.Offset != nil {
		if r.Index != nil {
			return nil, fmt.Errorf("tpu: give an index or an offset, not both: %w", ErrInvalidArgument)
		}
		if len(r.Offset) != q.N {
			return nil, fmt.Errorf("tpu: offset %v has %d coordinates for a %dD shape: %w", r.Offset, len(r.Offset), q.N, ErrInvalidShape)
		}
		q.HasOff = true
		for i, v := range r.Offset {
			if v < 0 {
				return nil, fmt.Errorf("tpu: offset %v: %w", r.Offset, ErrInvalidIndex)
			}
			q.Off[i] = v
		}
	}
	return q, nil
}

// leaseRec is a stored lease (the Lua scripts write the same JSON).
type leaseRec struct {
	ID     string `json:"id"`
	Slice  string `json:"slice"`
	Kind   string `json:"kind"` // "slice" or "subslice"
	S      [3]int `json:"s"`
	Origin [3]int `json:"o"`
	PD     [3]int `json:"pd"` // the parent slice's extents
	Index  int    `json:"idx"`
	Holder string `json:"holder"`
	Token  int64  `json:"token"`
	Exp    int64  `json:"exp"` // expiry, Unix ms on the store's clock
	Sub    bool   `json:"sub"` // below the host block (AllowSubHost)
}

func leaseID(slice string, s Shape, index int) string {
	return slice + "." + s.String() + "." + strconv.Itoa(index)
}

// HostEnv is the environment for one host of a lease.
type HostEnv struct {
	Host string            `json:"host"`
	Env  map[string]string `json:"env"`
}

// Lease is a granted reservation with its accounting. Chips and Hosts are lists; Hosts are in worker order
// within the lease (X-minor over its host grid), head first.
type Lease struct {
	ID              string            `json:"lease_id"` // "<slice>.<shape>.<index>": names the tile, so a stale holder meets the new token
	Token           int64             `json:"token"`    // fencing token, increasing per pool
	Pool            string            `json:"pool"`
	Slice           string            `json:"slice"`
	Kind            string            `json:"kind"` // "slice" or "subslice"
	Generation      string            `json:"generation"`
	Topology        string            `json:"topology"`       // the leased shape
	SliceTopology   string            `json:"slice_topology"` // the parent's
	Index           int               `json:"index"`          // tile index in the parent (0 for a whole slice)
	Origin          []int             `json:"origin"`         // chip offset of the tile
	Holder          string            `json:"holder"`
	ExpiresAt       time.Time         `json:"expires_at"`
	Chips           [][]int           `json:"chips"` // chip coordinates, X-minor
	Hosts           []string          `json:"hosts"`
	WorkerIDs       []int             `json:"worker_ids"` // the hosts' worker IDs in the parent slice
	Head            string            `json:"head"`
	ChipCount       int               `json:"chip_count"`
	HostCount       int               `json:"host_count"`
	TensorCoreCount int               `json:"tensorcore_count"`
	DeviceCount     int               `json:"device_count"`
	HBMBytes        int64             `json:"hbm_bytes"`
	PodType         string            `json:"pod_type"`
	GKEAccelerator  string            `json:"gke_accelerator"`
	Env             map[string]string `json:"env"`      // common to every host
	HostEnv         []HostEnv         `json:"host_env"` // TPU_WORKER_ID per host, in Hosts order
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// buildLease computes a lease's accounting from its record and slice.
func buildLease(pool string, l *leaseRec, r *sliceRec) Lease {
	s := Shape{N: r.N, D: l.S}
	out := Lease{ID: l.ID, Token: l.Token, Pool: pool, Slice: l.Slice, Kind: l.Kind, Generation: r.Gen,
		Topology: s.String(), SliceTopology: r.Topo, Index: l.Index, Origin: append([]int(nil), l.Origin[:r.N]...),
		Holder: l.Holder, ExpiresAt: time.UnixMilli(l.Exp).UTC()}
	workers := map[int]bool{}
	for i := range s.Chips() {
		c := s.coord(i)
		for k := range 3 {
			c[k] += l.Origin[k]
		}
		out.Chips = append(out.Chips, append([]int(nil), c[:r.N]...))
		workers[r.worker(c)] = true
	}
	for w := range workers {
		out.WorkerIDs = append(out.WorkerIDs, w)
	}
	slices.Sort(out.WorkerIDs)
	for _, w := range out.WorkerIDs {
		out.Hosts = append(out.Hosts, r.Hosts[w])
	}
	out.Head = out.Hosts[0]
	g := r.gen
	out.ChipCount, out.HostCount = s.Chips(), len(out.Hosts)
	out.TensorCoreCount = out.ChipCount * g.TensorCoresPerChip
	out.DeviceCount = out.ChipCount * r.Devices
	out.HBMBytes = int64(out.ChipCount) * g.HBMBytesPerChip
	out.PodType, out.GKEAccelerator = g.PodType(out.ChipCount), g.GKEAccelerator
	var hostBounds, chipBounds [3]int
	for k := range 3 {
		hb := min(r.HB[k], l.S[k])
		chipBounds[k] = hb
		hostBounds[k] = l.S[k] / hb
	}
	out.Env = map[string]string{
		"TPU_WORKER_HOSTNAMES":      strings.Join(out.Hosts, ","),
		"TPU_HOST_BOUNDS":           joinInts(hostBounds[:]),
		"TPU_CHIPS_PER_HOST_BOUNDS": joinInts(chipBounds[:]),
		"TPU_TOPOLOGY":              s.String(),
		"TPU_ACCELERATOR_TYPE":      out.PodType,
	}
	for i, h := range out.Hosts {
		out.HostEnv = append(out.HostEnv, HostEnv{Host: h, Env: map[string]string{"TPU_WORKER_ID": strconv.Itoa(i)}})
	}
	return out
}
