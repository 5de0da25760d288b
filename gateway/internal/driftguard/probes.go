package driftguard

import "encoding/json"

// probe is one fixed chat checked against every endpoint's /tokenize before it gets token IDs.
type probe struct {
	name string
	// messages and tools are the chat (JSON), without "model".
	messages, tools string
}

// probes cover what templates most often render differently: the system prompt, turn boundaries and
// assistant turns, and tool definitions with a tool call and its result.
var probes = []probe{
	{name: "system", messages: `[{"role":"system","content":"You are a careful assistant. Answer in one short sentence."},` +
		`{"role":"user","content":"What is the capital of France?"}]`},
	{name: "multi_turn", messages: `[{"role":"user","content":"Hi! Can you help me plan a trip?"},` +
		`{"role":"assistant","content":"Of course. Where would you like to go, and when?"},` +
		`{"role":"user","content":"Lisbon, for three days in May.\nI like food and museums."}]`},
	{name: "tool_call",
		tools: `[{"type":"function","function":{"name":"get_weather","description":"Current weather for a city.",` +
			`"parameters":{"type":"object","properties":{"city":{"type":"string","description":"City name"}},"required":["city"]}}}]`,
		messages: `[{"role":"user","content":"What's the weather in Oslo?"},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]},` +
			`{"role":"tool","tool_call_id":"call_1","content":"{\"temperature_c\": 4, \"sky\": \"overcast\"}"},` +
			`{"role":"user","content":"Thanks. Should I bring an umbrella?"}]`},
}

// body returns the probe as a chat body for model (what both the gateway and the engine tokenize).
func (p probe) body(model string) []byte {
	m, _ := json.Marshal(model)
	b := []byte(`{"model":` + string(m) + `,"messages":` + p.messages)
	if p.tools != "" {
		b = append(b, `,"tools":`+p.tools...)
	}
	return append(b, '}')
}
