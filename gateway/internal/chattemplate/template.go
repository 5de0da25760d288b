package chattemplate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// Default limits (see Limits).
const (
	DefaultMaxMessages    = 16384
	DefaultMaxOutputBytes = 16 << 20
	DefaultMaxIterations  = 1 << 20
	DefaultMaxDepth       = 256
	DefaultTimeout        = 2 * time.Second
)

// Limits bound one render. Zero fields take the defaults above.
type Limits struct {
	// MaxMessages is the longest message list accepted; a longer one is a *RequestError with ErrLimit,
	// found while the list is decoded.
	MaxMessages int
	// MaxOutputBytes bounds the rendered prompt in bytes. Output is also metered while the template runs
	// (every {{ }} value and the literal text of every loop or macro body, counted generously), and the
	// render stops once that meter passes 4x this bound.
	MaxOutputBytes int
	// MaxIterations bounds for-loop iterations plus macro calls across the whole render.
	MaxIterations int
	// MaxDepth bounds macro-call nesting and recursive-loop depth. ardanlabs/jinja recurses on the Go
	// stack without a bound of its own; a runaway recursion would otherwise overflow it and kill the
	// process (about 1.7 KB of stack per macro level, measured).
	MaxDepth int
	// Timeout bounds the wall time of the template run; it is checked every 256 loop iterations or macro
	// calls. The caller's context deadline, if sooner, applies too.
	Timeout time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxMessages <= 0 {
		l.MaxMessages = DefaultMaxMessages
	}
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if l.MaxIterations <= 0 {
		l.MaxIterations = DefaultMaxIterations
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	if l.Timeout <= 0 {
		l.Timeout = DefaultTimeout
	}
	return l
}

// Option configures a Template.
type Option func(*config)

type config struct {
	limits        Limits
	defaultKwargs *jinja.Dict
	excludeTools  bool
	now           func() time.Time
	err           error // an invalid option, reported by New/Load
}

// WithLimits sets the render limits.
func WithLimits(l Limits) Option { return func(c *config) { c.limits = l } }

// WithDefaultKwargs sets server-side template variables, overridden by a request's
// chat_template_kwargs (vLLM's --default-chat-template-kwargs). kwargsJSON is a JSON object; key order is
// kept. An invalid object makes New/Load fail.
func WithDefaultKwargs(kwargsJSON []byte) Option {
	return func(c *config) {
		v, err := parseJSONValue(kwargsJSON)
		if err != nil || !v.IsDict() {
			c.err = fmt.Errorf("chattemplate: default kwargs must be a JSON object")
			return
		}
		c.defaultKwargs = v.AsDict()
	}
}

// WithExcludeToolsWhenToolChoiceNone drops the tools from the template when the request says
// "tool_choice": "none" (vLLM's --exclude-tools-when-tool-choice-none).
func WithExcludeToolsWhenToolChoiceNone(exclude bool) Option {
	return func(c *config) { c.excludeTools = exclude }
}

// WithClock sets the clock behind the template function strftime_now (default time.Now, local time,
// as Python's datetime.now()).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// compiled is one named chat template, compiled once.
type compiled struct {
	name   string
	tmpl   *jinja.Template
	format ContentFormat
	native nativeKind // a template this package also renders natively for plain requests (native.go)
}

// Template renders OpenAI chat requests into prompt text exactly as vLLM would hand them to the model's
// chat template (see the package documentation). It is immutable and safe for concurrent use.
type Template struct {
	byName  map[string]*compiled
	special []specialToken // in transformers' special_tokens_map order
	cfg     config
}

type specialToken struct {
	name  string
	value jinja.Value // string, or list of strings for additional_special_tokens
}

// specialTokenNames is transformers' SPECIAL_TOKENS_ATTRIBUTES order.
var specialTokenNames = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "additional_special_tokens"}

// New compiles a single chat template. special maps template variable names such as "bos_token" to their
// text; they are passed to every render, as transformers passes special_tokens_map.
func New(source string, special map[string]string, opts ...Option) (*Template, error) {
	var sp []specialToken
	seen := map[string]bool{}
	for _, n := range specialTokenNames {
		if v, ok := special[n]; ok && v != "" {
			sp = append(sp, specialToken{name: n, value: jinja.NewString(v)})
			seen[n] = true
		}
	}
	var rest []string
	for n := range special {
		if !seen[n] && special[n] != "" {
			rest = append(rest, n)
		}
	}
	sort.Strings(rest)
	for _, n := range rest {
		sp = append(sp, specialToken{name: n, value: jinja.NewString(special[n])})
	}
	return build(map[string]string{"default": source}, sp, opts)
}

func build(sources map[string]string, special []specialToken, opts []Option) (*Template, error) {
	cfg := config{now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	cfg.limits = cfg.limits.withDefaults()
	t := &Template{byName: map[string]*compiled{}, special: special, cfg: cfg}
	for name, src := range sources {
		c, err := compile(name, src)
		if err != nil {
			return nil, err
		}
		t.byName[name] = c
	}
	return t, nil
}

func compile(name, src string) (c *compiled, err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("chattemplate: template %q: compiler panic: %v", name, r)
		}
	}()
	src = normalizeNewlines(src)
	segs, err := lexTemplate(src)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: template %q: %w", name, err)
	}
	tmpl, err := jinja.Compile(rewrite(segs))
	if err != nil {
		return nil, fmt.Errorf("chattemplate: template %q: %w", name, err)
	}
	return &compiled{name: name, tmpl: tmpl, format: detectContentFormat(segs), native: nativeFor(src)}, nil
}

// Load reads a Hugging Face model directory: tokenizer_config.json's chat_template (a string, or a list
// of {"name", "template"} entries) and its special tokens (strings or AddedToken objects). A
// chat_template.jinja file, and additional_chat_templates/<name>.jinja files, take precedence as they do
// in transformers; a processor's chat_template.json is used for requests without tools, as vLLM does. It
// fails with ErrNoTemplate when the directory defines no template.
func Load(dir string, opts ...Option) (*Template, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("chattemplate: load: %w", err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("chattemplate: load: tokenizer_config.json: %w", err)
	}
	sources := map[string]string{}
	if ct, ok := cfg["chat_template"]; ok {
		var s string
		var list []struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}
		switch {
		case json.Unmarshal(ct, &s) == nil:
			if s != "" {
				sources["default"] = s
			}
		case json.Unmarshal(ct, &list) == nil:
			for _, e := range list {
				sources[e.Name] = e.Template
			}
		case string(ct) == "null":
		default:
			return nil, fmt.Errorf("chattemplate: load: chat_template must be a string or a list of {name, template}")
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		sources["default"] = string(b)
	}
	if entries, err := os.ReadDir(filepath.Join(dir, "additional_chat_templates")); err == nil {
		for _, e := range entries {
			if n, ok := strings.CutSuffix(e.Name(), ".jinja"); ok && !e.IsDir() {
				b, err := os.ReadFile(filepath.Join(dir, "additional_chat_templates", e.Name()))
				if err != nil {
					return nil, fmt.Errorf("chattemplate: load: %w", err)
				}
				sources[n] = string(b)
			}
		}
	}
	// A processor's chat_template.json (multimodal models) is vLLM's second choice after a configured
	// template, used only when the request has no tools (vllm/renderers/hf.py resolve_chat_template).
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.json")); err == nil {
		var pc struct {
			ChatTemplate string `json:"chat_template"`
		}
		if json.Unmarshal(b, &pc) == nil && pc.ChatTemplate != "" {
			sources[processorTemplate] = pc.ChatTemplate
		}
	}
	if len(sources) == 0 {
		return nil, fmt.Errorf("chattemplate: load %s: %w", dir, ErrNoTemplate)
	}
	var special []specialToken
	for _, n := range specialTokenNames {
		v, ok := cfg[n]
		if !ok {
			continue
		}
		if n == "additional_special_tokens" {
			var items []json.RawMessage
			if json.Unmarshal(v, &items) != nil {
				continue
			}
			var list []jinja.Value
			for _, it := range items {
				if s := tokenText(it); s != "" {
					list = append(list, jinja.NewString(s))
				}
			}
			if len(list) > 0 {
				special = append(special, specialToken{name: n, value: jinja.NewList(list)})
			}
			continue
		}
		if s := tokenText(v); s != "" {
			special = append(special, specialToken{name: n, value: jinja.NewString(s)})
		}
	}
	return build(sources, special, opts)
}

// tokenText reads a special token given as a string or as an AddedToken object {"content": ...}.
func tokenText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.Content
	}
	return ""
}

// SpecialTokens returns the special-token variables passed to the template (additional_special_tokens
// joined by "\x00" if present); for tests and diagnostics.
func (t *Template) SpecialTokens() map[string]string {
	out := make(map[string]string, len(t.special))
	for _, s := range t.special {
		if s.value.IsString() {
			out[s.name] = s.value.AsString()
		} else {
			var parts []string
			for _, it := range s.value.AsList().Items {
				parts = append(parts, it.AsString())
			}
			out[s.name] = strings.Join(parts, "\x00")
		}
	}
	return out
}

// ContentFormat reports the content format used for requests without tools ("default" template).
func (t *Template) ContentFormat() ContentFormat {
	if c := t.pick(false); c != nil {
		return c.format
	}
	return FormatAuto
}

// processorTemplate names the template read from a processor's chat_template.json.
const processorTemplate = "\x00processor"

// pick mirrors vLLM's resolve_chat_template over transformers' get_chat_template: without tools a
// processor template (chat_template.json) wins; with tools, a template named "tool_use"; otherwise
// "default"; a single tokenizer template is used either way.
func (t *Template) pick(tools bool) *compiled {
	if !tools {
		if c, ok := t.byName[processorTemplate]; ok {
			return c
		}
	}
	if tools {
		if c, ok := t.byName["tool_use"]; ok {
			return c
		}
	}
	if c, ok := t.byName["default"]; ok {
		return c
	}
	var only *compiled
	n := 0
	for name, c := range t.byName {
		if name != processorTemplate {
			only, n = c, n+1
		}
	}
	if n == 1 {
		return only
	}
	// With tools and only a processor template, vLLM skips the processor template and finds none.
	return nil
}

// Render renders an OpenAI chat completion request body, as the client sent it, into the prompt text
// vLLM would produce. See RenderContext.
func (t *Template) Render(chatRequestJSON []byte) (string, error) {
	return t.RenderContext(context.Background(), chatRequestJSON)
}

// templateKwargsReserved are apply_chat_template parameters that never reach the template as variables.
var templateKwargsReserved = map[string]bool{
	"conversation": true, "chat_template": true, "tokenize": true, "padding": true, "truncation": true,
	"max_length": true, "return_tensors": true, "return_dict": true, "return_assistant_tokens_mask": true,
	"tokenizer_kwargs": true, "continue_final_message": true,
}

// RenderContext is Render with a context: cancellation and the context's deadline stop the template
// run (checked every 256 loop iterations or macro calls). It reads messages, tools, tool_choice,
// add_generation_prompt (default true), continue_final_message, documents, reasoning_effort and
// chat_template_kwargs; other fields are ignored. Errors are *RequestError (the body or its messages are
// malformed or hold unsupported content) or *RenderError (the template raised or failed, or a limit was
// hit).
func (t *Template) RenderContext(ctx context.Context, chatRequestJSON []byte) (prompt string, err error) {
	return t.RenderCached(ctx, chatRequestJSON, nil)
}

// RenderCached is RenderContext through a PromptCache (nil: none): the same prompt and the same errors;
// a plain request on Qwen3's template reuses the cached render of its first messages (see PromptCache).
func (t *Template) RenderCached(ctx context.Context, chatRequestJSON []byte, pc *PromptCache) (prompt string, err error) {
	defer func() {
		// ardanlabs/jinja is third-party code running operator-supplied templates on client data: a panic
		// in it must fail this request, not the gateway.
		if r := recover(); r != nil {
			prompt, err = "", &RenderError{Kind: ErrTemplateFailed, Message: fmt.Sprintf("template engine panic: %v", r)}
		}
	}()
	req, err := parseRequest(chatRequestJSON, parseOptions{maxMessages: t.cfg.limits.MaxMessages})
	if err != nil {
		return "", err
	}
	return t.render(ctx, req, pc)
}

// render renders a decoded request; it recovers from a template-engine panic as RenderContext does (the
// callers' deferred recover covers it too, this one is for RenderRequest).
func (t *Template) render(ctx context.Context, req *chatRequest, pc *PromptCache) (prompt string, err error) {
	lim := t.cfg.limits
	tools, err := req.toolDicts(t.cfg.excludeTools)
	if err != nil {
		return "", err
	}

	// Template variables, merged in vLLM's order (ChatCompletionRequest.build_chat_params, then
	// ChatParams.with_defaults over the server defaults and the tools): request kwargs, overridden by the
	// explicit request fields, laid over the server defaults; None and "auto" values do not override.
	kw := jinja.NewDict().AsDict()
	if t.cfg.defaultKwargs != nil {
		for _, k := range t.cfg.defaultKwargs.Keys {
			kw.Set(k, deepCopy(t.cfg.defaultKwargs.Data[k]))
		}
	}
	if !tools.IsNone() {
		kw.Set("tools", tools)
	}
	overrides := jinja.NewDict().AsDict()
	if req.kwargs != nil {
		for _, k := range req.kwargs.Keys {
			v := req.kwargs.Data[k]
			if k == "chat_template" && !v.IsNone() {
				return "", badRequest("chat_template_kwargs.chat_template", "chat template passed with the request; request templates are refused")
			}
			if k == "messages" {
				return "", badRequest("chat_template_kwargs.messages", "conflicts with the messages argument of the template")
			}
			overrides.Set(k, v)
		}
	}
	overrides.Set("add_generation_prompt", jinja.NewBool(req.addGenerationPrompt))
	overrides.Set("continue_final_message", jinja.NewBool(req.continueFinal))
	if !req.documents.IsNone() {
		overrides.Set("documents", req.documents)
	}
	if !req.reasoningEffort.IsNone() {
		overrides.Set("reasoning_effort", req.reasoningEffort)
	}
	for _, k := range overrides.Keys {
		v := overrides.Data[k]
		if v.IsNone() || (v.IsString() && v.AsString() == "auto") {
			continue
		}
		kw.Set(k, v)
	}
	toolsVar, _ := kw.Get("tools")
	if toolsVar.IsUndefined() {
		toolsVar = jinja.None()
	}
	addGen, _ := kw.Get("add_generation_prompt")
	contFinal, _ := kw.Get("continue_final_message")
	documents, ok := kw.Get("documents")
	if !ok {
		documents = jinja.None()
	}
	if contFinal.IsTruthy() && addGen.IsTruthy() {
		return "", badRequest("continue_final_message", "cannot set both `continue_final_message` and `add_generation_prompt` to true")
	}

	c := t.pick(!toolsVar.IsNone())
	if c == nil {
		return "", fmt.Errorf("chattemplate: %w (no \"default\" among the named templates)", ErrNoTemplate)
	}
	if c.native == nativeQwen3 && c.format == FormatString && toolsVar.IsNone() && ctx.Err() == nil {
		// A plain request on Qwen3's template: the same prompt without the engine (native.go). A request
		// whose context is done already goes to the engine, which reports that as before.
		if out, ok := renderNativeQwen3(req.messages, req.plain, kw, addGen, contFinal, pc); ok {
			if len(out) > lim.MaxOutputBytes {
				return "", &RenderError{Kind: ErrLimit, Message: fmt.Sprintf("rendered prompt is %d bytes, over the %d-byte limit", len(out), lim.MaxOutputBytes)}
			}
			return out, nil
		}
	}
	conv, err := conversation(req.messages, c.format)
	if err != nil {
		return "", err
	}

	data := make(map[string]jinja.Value, len(t.special)+kw.Len()+10)
	for _, s := range t.special {
		data[s.name] = deepCopy(s.value)
	}
	for _, k := range kw.Keys {
		if templateKwargsReserved[k] {
			continue
		}
		data[k] = kw.Data[k]
	}
	data["messages"] = jinja.NewList(conv)
	data["tools"] = toolsVar
	data["documents"] = documents
	data["add_generation_prompt"] = addGen

	b := newBudget(ctx, lim)
	b.bind(data, t.cfg.now)
	out, err := c.tmpl.RenderValues(data)
	switch {
	case b.err != nil:
		return "", b.err
	case b.raised != nil:
		return "", b.raised
	case err != nil:
		return "", &RenderError{Kind: ErrTemplateFailed, Message: err.Error(), Err: err}
	}
	if len(out) > lim.MaxOutputBytes {
		return "", &RenderError{Kind: ErrLimit, Message: fmt.Sprintf("rendered prompt is %d bytes, over the %d-byte limit", len(out), lim.MaxOutputBytes)}
	}
	if contFinal.IsTruthy() {
		return continueFinalMessage(out, conv)
	}
	return out, nil
}

// continueFinalMessage mirrors transformers' render_jinja_template post-processing for
// continue_final_message: cut the prompt right after the final message's text, so the model continues it.
func continueFinalMessage(rendered string, conv []jinja.Value) (string, error) {
	if len(conv) == 0 {
		return "", badRequest("messages", "continue_final_message needs a final message")
	}
	content, _ := conv[len(conv)-1].AsDict().Get("content")
	final := ""
	switch {
	case content.IsString():
		final = content.AsString()
	case content.IsList():
		found := false
		items := content.AsList().Items
		for i := len(items) - 1; i >= 0; i-- {
			if items[i].IsDict() {
				if txt, ok := items[i].AsDict().Get("text"); ok {
					final, found = txt.String(), true
					if txt.IsString() {
						final = txt.AsString()
					}
					break
				}
			}
		}
		if !found {
			return "", &RenderError{Kind: ErrTemplateFailed, Message: "continue_final_message is set but we could not find any text to continue in the final message!"}
		}
	}
	stripped := pyLstrip(pyRstrip(final))
	loc := strings.LastIndex(rendered, stripped)
	if loc < 0 {
		return "", &RenderError{Kind: ErrTemplateFailed, Message: "continue_final_message is set but the final message does not appear in the chat after applying the chat template!"}
	}
	lstripped := pyLstrip(final)
	if end := loc + len(lstripped); end <= len(rendered) && rendered[loc:end] == final {
		return rendered[:end], nil
	}
	return rendered[:loc+len(stripped)], nil
}

// deepCopy copies lists and dicts so a template that mutates a shared value (ardanlabs/jinja allows
// append/update, which Jinja2's immutable sandbox refuses) cannot affect other renders.
func deepCopy(v jinja.Value) jinja.Value {
	switch {
	case v.IsList():
		items := v.AsList().Items
		out := make([]jinja.Value, len(items))
		for i, it := range items {
			out[i] = deepCopy(it)
		}
		return jinja.NewList(out)
	case v.IsDict():
		d := v.AsDict()
		out := jinja.NewDict()
		for _, k := range d.Keys {
			out.AsDict().Set(k, deepCopy(d.Data[k]))
		}
		return out
	}
	return v
}

// budget meters one render; its hooks are bound as template globals.
type budget struct {
	ctx      context.Context
	lim      Limits
	deadline time.Time
	iter     int
	depth    int
	out      int
	err      *RenderError
	raised   *RenderError
}

func newBudget(ctx context.Context, lim Limits) *budget {
	dl := time.Now().Add(lim.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	return &budget{ctx: ctx, lim: lim, deadline: dl}
}

var errBudget = errors.New("render budget exhausted")

func (b *budget) fail(format string, args ...any) (jinja.Value, error) {
	if b.err == nil {
		b.err = &RenderError{Kind: ErrLimit, Message: fmt.Sprintf(format, args...)}
	}
	return jinja.Undefined(), errBudget
}

func (b *budget) step(weight int64) (jinja.Value, error) {
	b.iter++
	b.out += int(weight)
	if b.iter > b.lim.MaxIterations {
		return b.fail("more than %d loop iterations and macro calls", b.lim.MaxIterations)
	}
	if b.out > 4*b.lim.MaxOutputBytes {
		return b.fail("output over the %d-byte limit", b.lim.MaxOutputBytes)
	}
	if b.iter&255 == 0 {
		if err := b.ctx.Err(); err != nil {
			return b.fail("render stopped: %v", err)
		}
		if time.Now().After(b.deadline) {
			return b.fail("render took longer than %v", b.lim.Timeout)
		}
	}
	return jinja.None(), nil
}

func intArg(args []jinja.Value, i int) int64 {
	if i < len(args) && args[i].IsInt() {
		return args[i].AsInt()
	}
	return 0
}

func (b *budget) bind(data map[string]jinja.Value, now func() time.Time) {
	data[hookTick] = jinja.NewCallable(hookTick, func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if d := intArg(args, 0); d > int64(b.lim.MaxDepth) {
			return b.fail("recursive loop deeper than %d", b.lim.MaxDepth)
		}
		return b.step(intArg(args, 1))
	})
	data[hookEnter] = jinja.NewCallable(hookEnter, func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		b.depth++
		if b.depth > b.lim.MaxDepth {
			return b.fail("macro calls nested deeper than %d", b.lim.MaxDepth)
		}
		return b.step(intArg(args, 0))
	})
	data[hookLeave] = jinja.NewCallable(hookLeave, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		b.depth--
		return jinja.None(), nil
	})
	data[hookOut] = jinja.NewCallable(hookOut, func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.Undefined(), nil
		}
		v := args[0]
		switch {
		case v.IsString():
			b.out += len(v.AsString())
		case v.IsList() || v.IsDict():
			b.out += len(v.String())
		default:
			b.out += 8
		}
		if b.out > 4*b.lim.MaxOutputBytes {
			return b.fail("output over the %d-byte limit", b.lim.MaxOutputBytes)
		}
		return v, nil
	})
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := ""
		if len(args) > 0 {
			if args[0].IsString() {
				msg = args[0].AsString()
			} else {
				msg = args[0].String()
			}
		}
		if b.raised == nil {
			b.raised = &RenderError{Kind: ErrTemplateRaised, Message: msg}
		}
		return jinja.Undefined(), errors.New(msg)
	})
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now() needs a format string")
		}
		return jinja.NewString(strftime(now(), args[0].AsString())), nil
	})
	// Jinja2's sandbox caps range() at 100000 items (MAX_RANGE) and raises OverflowError beyond.
	data["range"] = jinja.NewCallable("range", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return sandboxRange(args)
	})
}
