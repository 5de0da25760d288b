#!/usr/bin/python3
"""Regenerate the reference chat-template renders for gateway/internal/chattemplate.

Run from gateway/internal/chattemplate/testdata:  /usr/bin/python3 gen/render_ref.py [OUTDIR]
(default OUTDIR: renders_py). Needs Debian's python3-jinja2, which loads only
under /usr/bin/python3. It writes OUTDIR/<model>/<conversation>.txt and, from
cases.json, cases_py.json (one expected output per case), and from
random_conversations.json (gen/random_convs.py), random_renders_py.json.

cases.json pairs a request (what the Go side renders) with "vars": the
template variables vLLM would hand the template for that request, written out
by hand from vLLM's source (chat_utils.py parse_chat_messages and
_postprocess_messages, protocol.py build_chat_params, model_dump of tools).
Cases with "continue_final" get transformers' continue_final_message cut.
strftime_now is pinned to 2026-07-04 09:05:03 for the cases.

The Jinja environment is the one transformers builds in
transformers/utils/chat_template_utils.py (_compile_jinja_template), which is
what vLLM's apply_chat_template path uses:
  - ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    with the loopcontrols extension,
  - the tojson filter replaced by json.dumps(ensure_ascii=False, ...),
  - globals raise_exception (raises TemplateError) and strftime_now.
Each conversation is rendered with messages=..., tools=... (None unless the
conversation asks for tools), add_generation_prompt=..., the model's special
tokens as keyword arguments, then the conversation's own kwargs.
A template that raises is recorded as "ERROR: <ExceptionType>: <message>".
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


FIXED_NOW = datetime.datetime(2026, 7, 4, 9, 5, 3)


def continue_final(rendered, messages):
    # transformers.utils.chat_template_utils.render_jinja_template, continue_final_message branch.
    final = messages[-1]["content"]
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                break
        else:
            raise ValueError("no text to continue in the final message")
    if final.strip() not in rendered:
        raise ValueError("final message not in the rendered chat")
    loc = rendered.rindex(final.strip())
    if rendered[loc:loc + len(final.lstrip())] == final:
        return rendered[:loc + len(final.lstrip())]
    return rendered[:loc + len(final.strip())]


def render_cases(special):
    env = environment()
    env.globals["strftime_now"] = lambda fmt: FIXED_NOW.strftime(fmt)
    out = {}
    for case in load("cases.json"):
        if "template_file" in case:
            with open(os.path.join("templates", case["template_file"] + ".jinja"), encoding="utf-8") as f:
                source = f.read()
            kwargs = dict(special.get(case["template_file"], {}))
        else:
            source = case["template"]
            kwargs = {}
        kwargs.update(case["vars"])
        try:
            text = env.from_string(source).render(**kwargs)
            if case.get("continue_final"):
                text = continue_final(text, kwargs["messages"])
        except Exception as exc:
            text = "ERROR: %s: %s" % (type(exc).__name__, exc)
        out[case["name"]] = text
    with open("cases_py.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


# The content format vLLM's _detect_content_format finds for each template (tested on the Go side).
CONTENT_FORMAT = {"gemma3": "openai"}


def vllm_content(messages, fmt):
    """The content step of vLLM's parse_chat_messages for text-only messages."""
    out = []
    for m in messages:
        m = dict(m)
        c = m.get("content")
        texts = [] if c is None else [c] if isinstance(c, str) else [p["text"] for p in c]
        if fmt == "openai" and m["role"] != "tool":
            m["content"] = [{"type": "text", "text": t} for t in texts]
        else:
            m["content"] = "\n".join(texts)
        out.append(m)
    return out


def render_random(special):
    """random_conversations.json (gen/random_convs.py) -> random_renders_py.json {model: {name: text}}."""
    env = environment()
    data = load("random_conversations.json")
    out = {}
    for fname in sorted(os.listdir("templates")):
        if not fname.endswith(".jinja"):
            continue
        model = fname[: -len(".jinja")]
        with open(os.path.join("templates", fname), encoding="utf-8") as f:
            template = env.from_string(f.read())
        out[model] = {}
        for conv in data["conversations"]:
            kwargs = dict(special.get(model, {}))
            kwargs.update(conv.get("kwargs", {}))
            try:
                msgs = vllm_content(conv["messages"], CONTENT_FORMAT.get(model, "string"))
                text = template.render(messages=msgs,
                                       tools=data["tools"] if conv.get("tools") else None,
                                       add_generation_prompt=conv["add_generation_prompt"], **kwargs)
            except Exception as exc:
                text = "ERROR: %s: %s" % (type(exc).__name__, exc)
            out[model][conv["name"]] = text
    with open("random_renders_py.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


def load(name):
    with open(name, encoding="utf-8") as f:
        return json.load(f)


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else "renders_py"
    conversations = load("conversations.json")
    tools = load("tools.json")
    special = load("special_tokens.json")
    env = environment()
    for fname in sorted(os.listdir("templates")):
        if not fname.endswith(".jinja"):
            continue
        model = fname[: -len(".jinja")]
        with open(os.path.join("templates", fname), encoding="utf-8") as f:
            template = env.from_string(f.read())
        os.makedirs(os.path.join(out_root, model), exist_ok=True)
        for conv in conversations:
            kwargs = dict(special.get(model, {}))
            kwargs.update(conv.get("kwargs", {}))
            try:
                text = template.render(
                    messages=conv["messages"],
                    tools=tools if conv.get("tools") else None,
                    add_generation_prompt=conv["add_generation_prompt"],
                    **kwargs)
            except Exception as exc:  # recorded, compared by the Go tests
                text = "ERROR: %s: %s" % (type(exc).__name__, exc)
            path = os.path.join(out_root, model, conv["name"] + ".txt")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
    render_cases(special)
    render_random(special)
    print("wrote", out_root, "cases_py.json and random_renders_py.json")


if __name__ == "__main__":
    main()
