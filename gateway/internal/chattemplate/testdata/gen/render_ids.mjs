// Regenerates ../render_ids.json: the token IDs of every reference render in ../renders_py, computed by
// HF's Rust tokenizers (npm "tokenizers" 0.23.2, the official napi binding) with add_special_tokens=false,
// which is how vLLM encodes a rendered chat prompt (the template already wrote BOS).
// Usage (in this folder): npm install && node render_ids.mjs [MODELS_DIR]
// MODELS_DIR defaults to the repository's .cache/models (filled by `make models`).
// Renders that recorded a template error ("ERROR: ...") have no IDs and are skipped.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');

const here = path.dirname(fileURLToPath(import.meta.url));
const testdata = path.resolve(here, '..');
const modelsDir = process.argv[2] || path.resolve(here, '../../../../.cache/models');
const rendersDir = path.join(testdata, 'renders_py');

const out = {};
for (const model of fs.readdirSync(rendersDir).sort()) {
  const tok = Tokenizer.fromFile(path.join(modelsDir, model, 'tokenizer.json'));
  out[model] = {};
  for (const file of fs.readdirSync(path.join(rendersDir, model)).sort()) {
    const text = fs.readFileSync(path.join(rendersDir, model, file), 'utf8');
    if (text.startsWith('ERROR: ')) continue;
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    out[model][file.replace(/\.txt$/, '')] = Array.from(enc.getIds());
  }
}
// One model per line keeps diffs readable.
const lines = Object.keys(out).map((m) => `  ${JSON.stringify(m)}: ${JSON.stringify(out[m])}`);
fs.writeFileSync(path.join(testdata, 'render_ids.json'), '{\n' + lines.join(',\n') + '\n}\n');
console.log('wrote', path.join(testdata, 'render_ids.json'));
