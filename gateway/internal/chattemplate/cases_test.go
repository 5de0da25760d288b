package chattemplate_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// engineCase is one entry of testdata/cases.json: a request for the Go side and, for the Python
// reference (testdata/gen/render_ref.py), the variables vLLM hands the template for it.
type engineCase struct {
	Name         string          `json:"name"`
	Template     string          `json:"template"`
	TemplateFile string          `json:"template_file"`
	Request      json.RawMessage `json:"request"`
	// KnownDifference documents a case where ardanlabs/jinja is known to differ from Jinja2; the test
	// asserts that it still differs, so a fixed engine shows up.
	KnownDifference string `json:"known_difference"`
}

// TestEngineCases checks Jinja2 semantics the 28 conversations do not reach (whitespace control across
// adjacent tags, newline normalization, raw blocks, tojson options and float formatting, Python value
// printing, strftime_now, range limits, loop controls, recursion) and vLLM's request shaping (message
// rebuild, content parts in both formats, tool dumps, kwargs merging, continue_final_message) against
// Python jinja2's output in testdata/cases_py.json.
func TestEngineCases(t *testing.T) {
	var cases []engineCase
	if err := json.Unmarshal(readFile(t, "testdata/cases.json"), &cases); err != nil {
		t.Fatal(err)
	}
	var want map[string]string
	if err := json.Unmarshal(readFile(t, "testdata/cases_py.json"), &want); err != nil {
		t.Fatal(err)
	}
	if len(cases) != len(want) || len(cases) < 60 {
		t.Fatalf("%d cases, %d expectations", len(cases), len(want))
	}
	clock := chattemplate.WithClock(func() time.Time { return time.Date(2026, 7, 4, 9, 5, 3, 0, time.UTC) })
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			var tmpl *chattemplate.Template
			var err error
			if c.TemplateFile != "" {
				src := readFile(t, filepath.Join("testdata/templates", c.TemplateFile+".jinja"))
				tmpl, err = chattemplate.New(string(src), specialTokens(t)[c.TemplateFile], clock)
			} else {
				tmpl, err = chattemplate.New(c.Template, nil, clock)
			}
			if err != nil {
				t.Fatal(err)
			}
			exp, ok := want[c.Name]
			if !ok {
				t.Fatal("no expectation; regenerate testdata/cases_py.json")
			}
			got, err := tmpl.Render(c.Request)
			if c.KnownDifference != "" {
				if err == nil && got == exp {
					t.Fatalf("known difference no longer differs (update cases.json and RATIONALE.md): %s", c.KnownDifference)
				}
				t.Logf("known difference: %s", c.KnownDifference)
				return
			}
			if msg, isErr := strings.CutPrefix(exp, "ERROR: "); isErr {
				var re *chattemplate.RenderError
				if !errors.As(err, &re) {
					t.Fatalf("want a *RenderError like %q, got %q, %v", msg, got, err)
				}
				if py, ok := strings.CutPrefix(msg, "TemplateError: "); ok {
					if !errors.Is(err, chattemplate.ErrTemplateRaised) || re.Message != py {
						t.Fatalf("raised %q (%v), want %q", re.Message, re.Kind, py)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			if got != exp {
				t.Fatalf("\n got: %q\nwant: %q", got, exp)
			}
		})
	}
}
