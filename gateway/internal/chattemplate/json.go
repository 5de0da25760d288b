package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// maxJSONDepth bounds nesting in request JSON (objects and arrays), so hostile input cannot drive the
// decoder or the template's recursion deep.
const maxJSONDepth = 128

// jsonDecoder turns request JSON into jinja values the way Python's json.loads builds objects: dicts
// keep key order (a repeated key keeps its first position and its last value), integers stay integers,
// numbers with a fraction or exponent become floats.
type jsonDecoder struct {
	dec *json.Decoder
}

func newJSONDecoder(data []byte) *jsonDecoder {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	return &jsonDecoder{dec: d}
}

var errJSONDepth = errors.New("JSON nested too deeply")

// value decodes the next JSON value.
func (d *jsonDecoder) value(depth int) (jinja.Value, error) {
	tok, err := d.dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	return d.fromToken(tok, depth)
}

func (d *jsonDecoder) fromToken(tok json.Token, depth int) (jinja.Value, error) {
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxJSONDepth {
			return jinja.Undefined(), errJSONDepth
		}
		switch t {
		case '{':
			out := jinja.NewDict()
			dict := out.AsDict()
			for d.dec.More() {
				k, err := d.dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				key, _ := k.(string)
				v, err := d.value(depth + 1)
				if err != nil {
					return jinja.Undefined(), err
				}
				dict.Set(key, v)
			}
			if _, err := d.dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return out, nil
		case '[':
			var items []jinja.Value
			for d.dec.More() {
				v, err := d.value(depth + 1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			if _, err := d.dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			if items == nil {
				items = []jinja.Value{}
			}
			return jinja.NewList(items), nil
		}
		return jinja.Undefined(), errors.New("unexpected JSON delimiter")
	case json.Number:
		return numberValue(string(t)), nil
	case string:
		return jinja.NewString(t), nil
	case bool:
		return jinja.NewBool(t), nil
	case nil:
		return jinja.None(), nil
	}
	return jinja.Undefined(), errors.New("unexpected JSON token")
}

// numberValue converts a JSON number literal like Python's json.loads: integers stay int (a value
// beyond int64 becomes the nearest float: Python would keep the exact big integer, a documented
// difference), others become float64 (overflow to ±Inf as Python's float() does).
func numberValue(s string) jinja.Value {
	if !strings.ContainsAny(s, ".eE") {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(n)
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 0) {
		return jinja.NewFloat(math.NaN())
	}
	return jinja.NewFloat(f)
}

// parseJSONValue decodes one complete JSON document (Python json.loads); trailing data is an error.
func parseJSONValue(data []byte) (jinja.Value, error) {
	s := &jsonScanner{data: data}
	v, err := s.value(0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if !s.atEnd() {
		return jinja.Undefined(), errors.New("trailing data after JSON value")
	}
	return v, nil
}

// parseJSONValueStd is parseJSONValue on encoding/json, kept as the oracle FuzzJSONScanner compares with.
func parseJSONValueStd(data []byte) (jinja.Value, error) {
	d := newJSONDecoder(data)
	v, err := d.value(0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := d.dec.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("trailing data after JSON value")
	}
	return v, nil
}
