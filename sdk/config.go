package sdk

import (
	"fmt"
	"math"
	"strconv"
)

// Field is one numeric config key DecodeConfig may fill.
type Field struct {
	Name     string   // JSON key, matched exactly
	Dst      *float64 // receives the value; left unchanged (the default) when the key is absent
	Min, Max float64  // inclusive range the value must fall in
}

// ConfigError is DecodeConfig's error: the offending key (empty for a syntax error) and why.
type ConfigError struct {
	Key    string // the JSON key at fault ("" when the config as a whole is malformed)
	Offset int    // byte offset into the config where the problem was found
	Reason string // what is wrong, e.g. "unknown key", "duplicate key"
}

// Error implements error.
func (e *ConfigError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("sdk: config: %s at byte %d", e.Reason, e.Offset)
	}
	return fmt.Sprintf("sdk: config key %q: %s", e.Key, e.Reason)
}

// DecodeConfig parses a policy config: empty input, or a flat JSON object whose values are numbers
// (true/false are not accepted; nested values are not supported). Every key must be one of fields and
// appear once, and its value must be finite and within [Min,Max]; otherwise it returns a *ConfigError and
// leaves fields it had not reached unchanged. It exists so guests need not link encoding/json (about
// 1.7 MB of Wasm); it is strict like a DisallowUnknownFields decoder.
func DecodeConfig(data []byte, fields ...Field) error {
	p := cfgParser{b: data}
	p.ws()
	if p.i == len(p.b) {
		return nil
	}
	if !p.eat('{') {
		return p.fail("expected '{'")
	}
	var seen uint64
	p.ws()
	if p.eat('}') {
		return p.end()
	}
	for {
		p.ws()
		key, ok := p.str()
		if !ok {
			return p.fail("expected a string key")
		}
		p.ws()
		if !p.eat(':') {
			return p.fail("expected ':'")
		}
		p.ws()
		start := p.i
		for p.i < len(p.b) && isNumByte(p.b[p.i]) {
			p.i++
		}
		if start == p.i || p.b[start] == '+' {
			return &ConfigError{Key: string(key), Offset: start, Reason: "value is not a number"}
		}
		v, err := strconv.ParseFloat(string(p.b[start:p.i]), 64)
		if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
			return &ConfigError{Key: string(key), Offset: start, Reason: "value is not a finite number"}
		}
		fi := -1
		for j := range fields {
			if fields[j].Name == string(key) {
				fi = j
				break
			}
		}
		switch {
		case fi < 0:
			return &ConfigError{Key: string(key), Offset: start, Reason: "unknown key"}
		case fi < 64 && seen&(1<<fi) != 0:
			return &ConfigError{Key: string(key), Offset: start, Reason: "duplicate key"}
		case v < fields[fi].Min || v > fields[fi].Max:
			return &ConfigError{Key: string(key), Offset: start,
				Reason: fmt.Sprintf("value %g outside [%g, %g]", v, fields[fi].Min, fields[fi].Max)}
		}
		if fi < 64 {
			seen |= 1 << fi
		}
		*fields[fi].Dst = v
		p.ws()
		if p.eat('}') {
			return p.end()
		}
		if !p.eat(',') {
			return p.fail("expected ',' or '}'")
		}
	}
}

type cfgParser struct {
	b []byte
	i int
}

func (p *cfgParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *cfgParser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a JSON string without escapes (config keys are plain identifiers).
func (p *cfgParser) str() ([]byte, bool) {
	if !p.eat('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], true
		case c == '\\' || c < 0x20:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

func (p *cfgParser) end() error {
	p.ws()
	if p.i != len(p.b) {
		return p.fail("trailing data after object")
	}
	return nil
}

func (p *cfgParser) fail(reason string) error { return &ConfigError{Offset: p.i, Reason: reason} }

func isNumByte(c byte) bool {
	return c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}
