package sdk

import "math/bits"

// Rand is SplitMix64 (Steele, Lea, Flood 2014): a tiny deterministic generator a policy seeds from
// Request.Seed, so the native and Wasm builds of a policy draw the same numbers. Not for cryptography.
type Rand struct{ state uint64 }

// NewRand returns a generator seeded with seed.
func NewRand(seed uint64) Rand { return Rand{state: seed} }

// Uint64 returns the next 64 pseudo-random bits.
func (r *Rand) Uint64() uint64 {
	r.state += 0x9e3779b97f4a7c15
	return Mix64(r.state)
}

// Intn returns a number in [0,n) (by multiply-shift, so slightly biased for huge n); n must be > 0.
func (r *Rand) Intn(n int) int {
	hi, _ := bits.Mul64(r.Uint64(), uint64(n))
	return int(hi)
}

// Mix64 is SplitMix64's finalizer: a bijective scramble of x. Mix64(seed ^ k) gives a per-item tie-break
// key that depends on the request's seed.
func Mix64(x uint64) uint64 {
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// TieKey is the seeded tie-break key of endpoint index i for a request with seed seed.
func TieKey(seed uint64, i uint32) uint64 { return Mix64(seed ^ (uint64(i)+1)*0x9e3779b97f4a7c15) }
