"""Measures the Jinja render of Qwen3's chat template for the benchmark conversations on this machine, as
transformers renders it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks), and writes each
rendered prompt for calibrate_tokenize.mjs.

    /usr/bin/python3 gateway/testdata/ttft/calibrate_render.py OUTDIR PAIRS...
prints one JSON line per size: {"pairs", "render_ms_median", "chars", "prompt_file"}."""
import json, os, statistics, sys, time

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conversation import messages  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
cfg = json.load(open(os.path.join(here, "../../../examples/models/qwen3/tokenizer_config.json")))


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
tmpl = env.from_string(cfg["chat_template"])

out = sys.argv[1]
for pairs in map(int, sys.argv[2:]):
    msgs = messages(pairs)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        prompt = tmpl.render(messages=msgs, add_generation_prompt=True, bos_token="", eos_token="<|im_end|>")
        times.append((time.perf_counter() - t) * 1000)
    path = os.path.join(out, "prompt_%d.txt" % pairs)
    open(path, "w").write(prompt)
    print(json.dumps({"pairs": pairs, "render_ms_median": round(statistics.median(times), 3), "chars": len(prompt),
                      "prompt_file": path}))
