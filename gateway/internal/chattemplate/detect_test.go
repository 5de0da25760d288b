package chattemplate

import (
	"os"
	"testing"
	"time"
)

// TestDetectContentFormat follows vLLM's _detect_content_format (vllm/renderers/hf.py) on synthetic
// templates and on the four reference templates.
func TestDetectContentFormat(t *testing.T) {
	cases := []struct {
		src  string
		want ContentFormat
	}{
		{"{% for message in messages %}{{ message['content'] }}{% endfor %}", FormatString},
		{"{% for message in messages %}{% for content in message['content'] %}{{ content['text'] }}{% endfor %}{% endfor %}", FormatOpenAI},
		{"{% for message in messages %}{% for content in message.content %}{% endfor %}{% endfor %}", FormatOpenAI},
		{`{% for message in messages %}{% for content in message["content"] %}{% endfor %}{% endfor %}`, FormatOpenAI},
		{"{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for c in m['content'] | selectattr('type', 'equalto', 'text') %}{% endfor %}{% endfor %}", FormatOpenAI},
		{"{% set a = messages %}{% set b = a[1:] | list %}{% for m in b %}{% for c in m.content %}{% endfor %}{% endfor %}", FormatOpenAI},
		{"{% for m in messages if m.role != 'system' %}{% for c in m.content if c.type == 'text' %}{% endfor %}{% endfor %}", FormatOpenAI},
		{"{% for m in messages[::-1] %}{% for c in (m.content) %}{% endfor %}{% endfor %}", FormatOpenAI},
		{"{% for m in messages %}{% for c in m.content[1:] %}{% endfor %}{% endfor %}", FormatOpenAI},
		{"{% for c in messages[0]['content'] %}{% endfor %}", FormatString},
		{"{% for m in messages %}{% for c in m.content.split() %}{% endfor %}{% endfor %}", FormatString},
		{"{% for m in messages %}{% for c in m.parts %}{% endfor %}{% endfor %}", FormatString},
		{"{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}{% endfor %}", FormatString},
		{"{% set first = messages[0] %}{% for c in first.content %}{% endfor %}", FormatString},
		{"{% for m in other %}{% for c in m.content %}{% endfor %}{% endfor %}", FormatString},
		{"{% for i, m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}", FormatString},
		{"{# {% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %} #}", FormatString},
		{"{% raw %}{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}{% endraw %}", FormatString},
	}
	for _, c := range cases {
		segs, err := lexTemplate(normalizeNewlines(c.src))
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		if got := detectContentFormat(segs); got != c.want {
			t.Errorf("%s: got %v, want %v", c.src, got, c.want)
		}
	}
	for m, want := range map[string]ContentFormat{"gemma3": FormatOpenAI, "qwen3": FormatString, "llama3_1": FormatString, "deepseek_v3": FormatString} {
		src, err := os.ReadFile("testdata/templates/" + m + ".jinja")
		if err != nil {
			t.Fatal(err)
		}
		segs, err := lexTemplate(normalizeNewlines(string(src)))
		if err != nil {
			t.Fatal(err)
		}
		if got := detectContentFormat(segs); got != want {
			t.Errorf("%s: got %v, want %v", m, got, want)
		}
	}
}

// TestStrftime pins directives whose output Python's strftime defines (glibc, C locale).
func TestStrftimeDirectives(t *testing.T) {
	// Values below are what /usr/bin/python3 prints for
	// datetime.datetime(2026, 1, 5, 15, 4, 9).strftime(f) with each format.
	tm := mustDate(2026, 1, 5, 15, 4, 9)
	cases := map[string]string{
		"%d %b %Y":       "05 Jan 2026",
		"%-d %-m %-H":    "5 1 15",
		"%e|%k|%l":       " 5|15| 3",
		"%I %p %j %U":    "03 PM 005 01",
		"%c":             "Mon Jan  5 15:04:09 2026",
		"%D %F %T %R %r": "01/05/26 2026-01-05 15:04:09 15:04 03:04:09 PM",
		"%u %w %y %C %%": "1 1 26 20 %",
		"%W":             "01",
		"2006 Jan 1 %Y":  "2006 Jan 1 2026",
		"trailing %":     "trailing %",
	}
	for f, want := range cases {
		if got := strftime(tm, f); got != want {
			t.Errorf("strftime(%q) = %q, want %q", f, got, want)
		}
	}
	// Week numbers at the year's edges (Python: '52 52' and '00 00').
	if got := strftime(mustDate(2026, 12, 31, 0, 0, 0), "%U %W"); got != "52 52" {
		t.Errorf("2026-12-31 %%U %%W = %q", got)
	}
	if got := strftime(mustDate(2026, 1, 1, 0, 0, 0), "%U %W"); got != "00 00" {
		t.Errorf("2026-01-01 %%U %%W = %q", got)
	}
}

func mustDate(y, mo, d, h, mi, s int) time.Time {
	return time.Date(y, time.Month(mo), d, h, mi, s, 0, time.UTC)
}
