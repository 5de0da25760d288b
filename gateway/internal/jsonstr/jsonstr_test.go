package jsonstr

import (
	"encoding/json"
	"errors"
	"testing"
)

// check decodes lit (a whole literal, quotes included) and compares with encoding/json: the same text when
// encoding/json accepts it, an *Error when it does not.
func check(t *testing.T, lit []byte) {
	t.Helper()
	if len(lit) == 0 || lit[0] != '"' {
		return
	}
	got, next, err := AppendUnquoted(nil, lit, 1, true)
	var want string
	werr := json.Unmarshal(lit, &want)
	if err == nil && next != len(lit) {
		return // a valid literal followed by more bytes: encoding/json refuses the trailing data
	}
	if (err == nil) != (werr == nil) {
		t.Fatalf("%q: AppendUnquoted err %v, encoding/json err %v", lit, err, werr)
	}
	if err != nil {
		if e, ok := errors.AsType[*Error](err); !ok || e.Offset < 1 || e.Offset > len(lit) {
			t.Fatalf("%q: error %v (%T) without an offset inside the input", lit, err, err)
		}
		return
	}
	if string(got) != want {
		t.Fatalf("%q: %q, encoding/json %q", lit, got, want)
	}
}

func TestAppendUnquoted(t *testing.T) {
	for _, lit := range []string{
		`""`, `"plain"`, `"a\"b\\c\/d\b\f\n\r\t"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx"`,
		`"\ud83d\u0041"`, `"\ude00"`, "\"\xff\xfe\"", "\"caf\xc3\xa9\"", `"unterminated`, `"bad\q"`, `"\u12"`,
		`"\u12G4"`, "\"ctl\x01\"", `"\`,
	} {
		check(t, []byte(lit))
	}
	// Without replaceInvalid, bytes that are not UTF-8 are kept (tokenizer.json byte-level vocabularies).
	got, _, err := AppendUnquoted(nil, []byte("\"\xff\\n\""), 1, false)
	if err != nil || string(got) != "\xff\n" {
		t.Fatalf("keep invalid: %q %v", got, err)
	}
}

func FuzzAppendUnquoted(f *testing.F) {
	f.Add([]byte(`"a\u00e9\ud83d\ude00\n"`))
	f.Add([]byte("\"\xed\xa0\x80\""))
	f.Fuzz(func(t *testing.T, lit []byte) { check(t, lit) })
}
