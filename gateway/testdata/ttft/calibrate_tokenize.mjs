// Measures HF's Rust tokenizer (npm `tokenizers`, the Node binding of huggingface/tokenizers) encoding a
// rendered prompt with Qwen3's tokenizer.json, without special tokens, as vLLM encodes chat prompts.
//
//   npm install --prefix /tmp/hf tokenizers            (not committed)
//   NODE_PATH=/tmp/hf/node_modules node gateway/testdata/ttft/calibrate_tokenize.mjs TOKENIZER_JSON PROMPT_FILE...
// prints one JSON line per file: {"file", "tokens", "encode_ms_median"}.
import { createRequire } from "module";
import { readFileSync } from "fs";
const require = createRequire(process.env.NODE_PATH + "/");
const { Tokenizer } = require("tokenizers");

const [tokPath, ...files] = process.argv.slice(2);
const tok = Tokenizer.fromFile(tokPath);
for (const f of files) {
  const text = readFileSync(f, "utf8");
  let n = 0;
  const times = [];
  for (let i = 0; i < 7; i++) {
    const t = process.hrtime.bigint();
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    times.push(Number(process.hrtime.bigint() - t) / 1e6);
    n = enc.getIds().length;
  }
  times.sort((a, b) => a - b);
  console.log(JSON.stringify({ file: f, tokens: n, encode_ms_median: Math.round(times[3] * 1000) / 1000 }));
}
