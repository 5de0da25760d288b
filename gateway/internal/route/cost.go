package route

import "math"

// satAdd returns a + b for non-negative a and b, saturated at math.MaxInt64: a request's cost never wraps
// negative (a negative cost is an invalid argument to the store), whatever max_tokens a client sends.
func satAdd(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// satMul returns a × b for non-negative a and b, saturated at math.MaxInt64.
func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
