package chattemplate_test

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// Load the demo model's template and render a chat request with a tool call sent the OpenAI way
// (arguments as a JSON string).
func ExampleLoad() {
	tmpl, err := chattemplate.Load("../../../examples/models/qwen3")
	if err != nil {
		panic(err)
	}
	prompt, err := tmpl.Render([]byte(`{
	  "model": "qwen3",
	  "messages": [
	    {"role": "user", "content": "Weather in Paris?"},
	    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
	      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
	    {"role": "tool", "tool_call_id": "c1", "content": "21 °C"}
	  ],
	  "chat_template_kwargs": {"enable_thinking": false}
	}`))
	if err != nil {
		panic(err)
	}
	fmt.Print(prompt)
	// Output:
	// <|im_start|>user
	// Weather in Paris?<|im_end|>
	// <|im_start|>assistant
	// <tool_call>
	// {"name": "get_weather", "arguments": {"city": "Paris"}}
	// </tool_call><|im_end|>
	// <|im_start|>user
	// <tool_response>
	// 21 °C
	// </tool_response><|im_end|>
	// <|im_start|>assistant
	// <think>
	//
	// </think>
}

// A template that raises, and a request the template cannot take, come back as typed errors.
func ExampleTemplate_Render_errors() {
	tmpl, err := chattemplate.New(
		`{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}{{ messages[0].content }}`,
		map[string]string{"bos_token": "<s>"})
	if err != nil {
		panic(err)
	}
	_, err = tmpl.Render([]byte(`{"messages": [{"role": "assistant", "content": "hi"}]}`))
	var re *chattemplate.RenderError
	fmt.Println(errors.As(err, &re), errors.Is(err, chattemplate.ErrTemplateRaised), re.Message)

	_, err = tmpl.Render([]byte(`{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]}`))
	var qe *chattemplate.RequestError
	fmt.Println(errors.As(err, &qe), errors.Is(err, chattemplate.ErrUnsupportedContent), qe.Path)
	// Output:
	// true true first message must be from the user
	// true true messages[0].content[0]
}
