// Regenerates kvgate's tokenizer goldens with HF's official Rust tokenizers (npm "tokenizers", napi binding).
//
// Usage (from this folder, after `npm ci`):
//   node regen_goldens.js [--models DIR] [--out DIR] [--renders DIR] [--ids DIR] [model ...]
// DIR defaults: --models $KVGATE_MODELS_DIR or <repo>/.cache/models (fetched by `make models`),
//               --out ../goldens. Models default to all five reference models.
// Inputs (in the out folder): corpus.jsonl and fuzz.jsonl ({"name","text"} per line), bench.txt.gz.
// Writes, per model M:
//   M.jsonl       one line per corpus.jsonl case, then one bench.txt line
//   fuzz-M.jsonl  one line per fuzz.jsonl case
// Case line: {"name", "ids" (add_special_tokens=false), then "special_prefix" (the IDs add_special_tokens=true
// puts in front) or "ids_special" (the whole list when it is not a pure prefix), then "decode_differs": true
// when decode(ids, skip_special_tokens=false) != text}. Bench line: {"name":"bench.txt","count","count_special",
// "sha256"} with sha256 over the IDs joined by ",". The format is the one of the shared reference goldens, so
// `git diff` after a run shows any drift.
// --renders DIR (default <repo>/gateway/chattemplate/testdata/renders_py): for every DIR/<model>/<name>.txt
// (reference chat-template renders), writes IDS/<model>.ids.jsonl (--ids, default
// <repo>/gateway/model/testdata/renders) with {"name","ids"} (add_special_tokens=false, as vLLM encodes chat
// prompts).
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const crypto = require('crypto');
const { Tokenizer } = require('tokenizers');

const ALL = ['qwen3', 'llama3_1', 'deepseek_v3', 'gemma3', 'llama2', 'llama2_metaspace_first'];

// Derived models: a reference model's tokenizer.json with a component swapped, to cover a component none of
// the five uses. The Go test (TestDerivedModels) applies the same edit. llama2_metaspace_first is Llama-2
// rewritten the way Mistral/Llama tokenizer.json files are now written: no normalizer, a Metaspace
// pre-tokenizer with prepend_scheme "first".
const DERIVED = {
  llama2_metaspace_first: {
    base: 'llama2',
    edit: (j) => {
      j.normalizer = null;
      j.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false };
      return j;
    },
  },
};

function loadTokenizer(modelsDir, m) {
  const d = DERIVED[m];
  if (!d) return Tokenizer.fromFile(path.join(modelsDir, m, 'tokenizer.json'));
  const j = d.edit(JSON.parse(fs.readFileSync(path.join(modelsDir, d.base, 'tokenizer.json'), 'utf8')));
  const tmp = path.join(require('os').tmpdir(), `kvgate-${m}-${process.pid}.json`);
  fs.writeFileSync(tmp, JSON.stringify(j));
  try { return Tokenizer.fromFile(tmp); } finally { fs.unlinkSync(tmp); }
}

function repoRoot() {
  let d = __dirname;
  while (!fs.existsSync(path.join(d, 'go.mod'))) {
    const p = path.dirname(d);
    if (p === d) throw new Error('no go.mod above ' + __dirname);
    d = p;
  }
  return d;
}

function parseArgs(argv) {
  const o = { models: process.env.KVGATE_MODELS_DIR || path.join(repoRoot(), '.cache', 'models'),
              out: path.join(__dirname, '..', 'goldens'),
              renders: path.join(repoRoot(), 'gateway', 'internal', 'chattemplate', 'testdata', 'renders_py'),
              ids: path.join(repoRoot(), 'gateway', 'internal', 'model', 'testdata', 'renders'), names: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--models') o.models = argv[++i];
    else if (argv[i] === '--out') o.out = argv[++i];
    else if (argv[i] === '--renders') o.renders = argv[++i];
    else if (argv[i] === '--ids') o.ids = argv[++i];
    else o.names.push(argv[i]);
  }
  if (o.names.length === 0) o.names = ALL;
  return o;
}

const readCases = (file) => fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

async function caseLine(tok, c) {
  const plain = Array.from((await tok.encode(c.text, null, { addSpecialTokens: false })).getIds());
  const special = Array.from((await tok.encode(c.text, null, { addSpecialTokens: true })).getIds());
  const rec = { name: c.name, ids: plain };
  if (!same(plain, special)) {
    const k = special.length - plain.length;
    if (k >= 0 && same(special.slice(k), plain)) rec.special_prefix = special.slice(0, k);
    else rec.ids_special = special;
  }
  if ((await tok.decode(plain, false)) !== c.text) rec.decode_differs = true;
  return JSON.stringify(rec);
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const corpus = readCases(path.join(o.out, 'corpus.jsonl'));
  const fuzz = readCases(path.join(o.out, 'fuzz.jsonl'));
  const bench = zlib.gunzipSync(fs.readFileSync(path.join(o.out, 'bench.txt.gz'))).toString('utf8');
  for (const m of o.names) {
    const tok = loadTokenizer(o.models, m);
    const lines = [];
    for (const c of corpus) lines.push(await caseLine(tok, c));
    const ids = Array.from((await tok.encode(bench, null, { addSpecialTokens: false })).getIds());
    const idsSpecial = (await tok.encode(bench, null, { addSpecialTokens: true })).getIds();
    lines.push(JSON.stringify({ name: 'bench.txt', count: ids.length, count_special: idsSpecial.length,
      sha256: crypto.createHash('sha256').update(ids.join(',')).digest('hex') }));
    fs.writeFileSync(path.join(o.out, m + '.jsonl'), lines.join('\n') + '\n');
    const flines = [];
    for (const c of fuzz) flines.push(await caseLine(tok, c));
    fs.writeFileSync(path.join(o.out, 'fuzz-' + m + '.jsonl'), flines.join('\n') + '\n');
    const rdir = path.join(o.renders, m);
    if (fs.existsSync(rdir)) {
      const rlines = [];
      for (const f of fs.readdirSync(rdir).filter((f) => f.endsWith('.txt')).sort()) {
        const text = fs.readFileSync(path.join(rdir, f), 'utf8');
        const rids = Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
        rlines.push(JSON.stringify({ name: f.slice(0, -4), ids: rids }));
      }
      fs.writeFileSync(path.join(o.ids, m + '.ids.jsonl'), rlines.join('\n') + '\n');
    }
    console.error(`${m}: ${corpus.length} corpus + ${fuzz.length} fuzz cases, bench ${ids.length} tokens`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
