#!/usr/bin/python3
"""Write random_conversations.json: seeded random chat conversations for the differential test.

Run from gateway/internal/chattemplate/testdata:  /usr/bin/python3 gen/random_convs.py
Messages are generated close to the shape vLLM hands the template (keys role, content, tool_calls /
tool_call_id in vLLM's order, parsed tool-call arguments, tools in model_dump shape with description and
parameters present); system and user content is sometimes a list of text parts. gen/render_ref.py applies
the one remaining step of vLLM's parse_chat_messages, the content format (parts joined with "\n" for string
templates, strings wrapped as one text part for gemma3's part-list template), before rendering.
"""
import json
import random

PIECES = [
    "Hello", "world", "  ", "\n", "\n\n", "\t", " trailing ", "Zürich", "天气", "😀", "é", "\u3000",
    "<b>&amp;</b>", "\"quoted\"", "'single'", "back\\slash", "{{ not a tag }}", "{% raw %}", "<think>",
    "</think>", "<|im_start|>", "<tool_call>", "</tool_response>", "1+1=2", "3.14", "-0", "null",
    "json: {\"a\": 1}", "tab\tand\ttabs", "line\r\nbreak", "\u2028", "x" * 40,
]


def text(rng, lo=0, hi=8):
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(lo, hi)))


def value(rng, depth=0):
    kind = rng.randint(0, 8 if depth < 2 else 5)
    if kind == 0:
        return rng.randint(-1000, 10**6)
    if kind == 1:
        return rng.choice([0.5, 1e-7, 1000000.0, 21.0, -3.25, 1e21, 123.456])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4, 5):
        return text(rng, 0, 3)
    if kind in (6, 7):
        return {text(rng, 1, 2).strip() or "k": value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather — °C <for> a city & \"region\"",
     "parameters": {"type": "object", "properties": {"location": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["location"]}}},
    {"type": "function", "function": {"name": "search", "description": None,
     "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "query 查询"}, "k": {"type": "integer", "default": 5}}}}},
    {"type": "function", "function": {"name": "noop", "description": "does nothing", "parameters": None}},
]


def content(rng):
    """A string, or (sometimes) a list of 1-3 text parts, as clients send multi-part messages."""
    if rng.random() < 0.3:
        return [{"type": "text", "text": text(rng, 0, 3)} for _ in range(rng.randint(1, 3))]
    return text(rng, 1)


def conversation(rng, i):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": content(rng)})
    call_id = 0
    for turn in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": content(rng)})
        if turn == 0 and rng.random() < 0.2:
            break
        r = rng.random()
        if r < 0.35:
            calls = []
            for _ in range(rng.randint(1, 2)):
                call_id += 1
                calls.append({"id": "call_%d" % call_id, "type": "function",
                              "function": {"name": rng.choice(TOOLS)["function"]["name"],
                                           "arguments": {"a": value(rng), text(rng, 1, 1).strip() or "b": value(rng)}}})
            msgs.append({"role": "assistant", "content": rng.choice(["", text(rng, 0, 2)]), "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "content": json.dumps(value(rng), ensure_ascii=False), "tool_call_id": c["id"]})
            msgs.append({"role": "assistant", "content": text(rng, 1)})
        elif r < 0.55:
            msgs.append({"role": "assistant", "content": "<think>\n" + text(rng, 0, 3) + "\n</think>\n\n" + text(rng, 1)})
        else:
            msgs.append({"role": "assistant", "content": text(rng, 1)})
    if rng.random() < 0.5 and msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": text(rng, 1)})
    conv = {"name": "r%03d" % i, "add_generation_prompt": rng.random() < 0.7, "messages": msgs}
    if rng.random() < 0.4:
        conv["tools"] = True
    if rng.random() < 0.3:
        conv["kwargs"] = {"enable_thinking": rng.random() < 0.5}
    return conv


def main():
    rng = random.Random(20261129)
    convs = [conversation(rng, i) for i in range(120)]
    with open("random_conversations.json", "w", encoding="utf-8") as f:
        json.dump({"tools": TOOLS, "conversations": convs}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("wrote random_conversations.json:", len(convs))


if __name__ == "__main__":
    main()
