package tpu

import (
	"fmt"
	"strconv"
	"strings"
)

// Shape is a slice topology or sub-slice shape: N (2 or 3) chip extents along X, Y[, Z]. A 2D shape has
// D[2] == 1. Shapes are never rotated: 2x4 and 4x2 differ.
type Shape struct {
	N int
	D [3]int
}

// ParseShape parses "AxB" or "AxBxC" (each extent 1..4096). Errors wrap ErrInvalidShape.
func ParseShape(s string) (Shape, error) {
	parts := strings.Split(strings.TrimSpace(s), "x")
	if len(parts) < 2 || len(parts) > 3 {
		return Shape{}, fmt.Errorf("tpu: shape %q: want AxB or AxBxC: %w", s, ErrInvalidShape)
	}
	sh := Shape{N: len(parts), D: [3]int{1, 1, 1}}
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 1 || v > 4096 || strconv.Itoa(v) != p {
			return Shape{}, fmt.Errorf("tpu: shape %q: extent %q: %w", s, p, ErrInvalidShape)
		}
		sh.D[i] = v
	}
	return sh, nil
}

// String is "AxB" or "AxBxC".
func (s Shape) String() string {
	if s.N == 2 {
		return fmt.Sprintf("%dx%d", s.D[0], s.D[1])
	}
	return fmt.Sprintf("%dx%dx%d", s.D[0], s.D[1], s.D[2])
}

// Chips is the number of chips, the product of the extents.
func (s Shape) Chips() int { return s.D[0] * s.D[1] * s.D[2] }

// Coord returns the first N coordinates of the X-minor chip index i in s.
func (s Shape) coord(i int) [3]int {
	return [3]int{i % s.D[0], (i / s.D[0]) % s.D[1], i / (s.D[0] * s.D[1])}
}

func (s Shape) index(c [3]int) int { return c[0] + c[1]*s.D[0] + c[2]*s.D[0]*s.D[1] }
