#!/usr/bin/python3
"""Regenerate the reference chat-template renders for gateway/chattemplate.

Run from gateway/chattemplate/testdata:  /usr/bin/python3 gen/render_ref.py [OUTDIR]
(default OUTDIR: renders_py). Needs Debian's python3-jinja2, which loads only
under /usr/bin/python3.

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
    print("wrote", out_root)


if __name__ == "__main__":
    main()
