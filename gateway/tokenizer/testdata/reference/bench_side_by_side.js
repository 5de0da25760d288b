// Side-by-side throughput: HF's Rust tokenizers (npm "tokenizers", napi binding) and kvgate's Go tokenizer
// on the same 1 MB text (../goldens/bench.txt.gz), in the same run.
//
// Usage (from this folder, after `npm ci`): node bench_side_by_side.js [--runs N] [model ...]
// Models default to qwen3 and llama3_1, read from $KVGATE_MODELS_DIR or <repo>/.cache/models.
//
// HF side, per model: the whole text in one encode() call (median of N runs after a warm-up), and the text
// cut after line ends into ~4 KB chunks passed to encodeBatch() (rayon: all cores) and, for reference, to
// encode() one by one. Go side: `go test -bench BenchmarkEncode/<model>/` in gateway/tokenizer (cold =
// empty word cache, warm = word cache filled from the golden corpus, a different text; parallel = ~4 KB
// chunks from GOMAXPROCS goroutines), median of N runs. Ratios: Go per core vs HF single encode, and Go
// per core vs HF encodeBatch per core (encodeBatch throughput / cores).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const zlib = require('zlib');
const { execFileSync } = require('child_process');
const { Tokenizer } = require('tokenizers');

function repoRoot() {
  let d = __dirname;
  while (!fs.existsSync(path.join(d, 'go.mod'))) {
    const p = path.dirname(d);
    if (p === d) throw new Error('no go.mod above ' + __dirname);
    d = p;
  }
  return d;
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const now = () => Number(process.hrtime.bigint()) / 1e9;

function chunks(text, size) {
  const out = []; let cur = '';
  for (const l of text.split(/(?<=\n)/)) { cur += l; if (cur.length > size) { out.push(cur); cur = ''; } }
  if (cur) out.push(cur);
  return out;
}

async function hf(file, text, runs) {
  const tok = Tokenizer.fromFile(file);
  const opts = { addSpecialTokens: false };
  const n = (await tok.encode(text, null, opts)).getIds().length; // warm-up
  const single = [];
  for (let i = 0; i < runs; i++) { const t0 = now(); await tok.encode(text, null, opts); single.push(n / (now() - t0)); }
  const parts = chunks(text, 4000);
  await tok.encodeBatch(parts, opts);
  const batch = [], seq = [];
  for (let i = 0; i < runs; i++) {
    let t0 = now(); let tot = 0;
    for (const e of await tok.encodeBatch(parts, opts)) tot += e.getIds().length;
    batch.push(tot / (now() - t0));
    t0 = now(); tot = 0;
    for (const p of parts) tot += (await tok.encode(p, null, opts)).getIds().length;
    seq.push(tot / (now() - t0));
  }
  return { tokens: n, single: median(single), batch: median(batch), seq: median(seq), chunks: parts.length };
}

function goBench(root, model, runs) {
  const env = { ...process.env, GOTOOLCHAIN: process.env.GOTOOLCHAIN || 'go1.27.3', GOFLAGS: '-buildvcs=false' };
  const out = execFileSync('go', ['test', '-run', '^$', '-bench', `^BenchmarkEncode$/^${model}$/`, '-benchtime', '10x',
    '-count', String(runs), './gateway/tokenizer'], { cwd: root, env, encoding: 'utf8', maxBuffer: 1 << 24 });
  const res = {};
  for (const line of out.split('\n')) {
    const m = line.match(/^BenchmarkEncode\/[^/]+\/(\w+)-\d+\s.*?([\d.]+) tok\/s/);
    if (m) (res[m[1]] = res[m[1]] || []).push(+m[2]);
  }
  for (const k of Object.keys(res)) res[k] = median(res[k]);
  return res;
}

async function main() {
  let args = process.argv.slice(2), runs = 5;
  if (args[0] === '--runs') { runs = +args[1]; args = args.slice(2); }
  const models = args.length ? args : ['qwen3', 'llama3_1'];
  const root = repoRoot();
  const base = process.env.KVGATE_MODELS_DIR || path.join(root, '.cache', 'models');
  const text = zlib.gunzipSync(fs.readFileSync(path.join(__dirname, '..', 'goldens', 'bench.txt.gz'))).toString('utf8');
  const cores = os.availableParallelism ? os.availableParallelism() : os.cpus().length;
  const M = (x) => (x / 1e6).toFixed(2);
  console.log(`bench.txt: ${Buffer.byteLength(text)} bytes, ${cores} cores, median of ${runs} runs, M tokens/s`);
  for (const m of models) {
    const h = await hf(path.join(base, m, 'tokenizer.json'), text, runs);
    const g = goBench(root, m, runs);
    console.log(`\n${m} (${h.tokens} tokens)`);
    console.log(`  HF Rust  encode(1 MB)            ${M(h.single)}`);
    console.log(`  HF Rust  encode x ${h.chunks} chunks      ${M(h.seq)}`);
    console.log(`  HF Rust  encodeBatch (${cores} cores)     ${M(h.batch)}   (${M(h.batch / cores)} per core)`);
    console.log(`  Go       cold, 1 core            ${M(g.cold)}   ${(g.cold / h.single).toFixed(1)}x HF encode, ${(g.cold / (h.batch / cores)).toFixed(1)}x HF batch/core`);
    console.log(`  Go       warm, 1 core            ${M(g.warm)}   ${(g.warm / h.single).toFixed(1)}x HF encode, ${(g.warm / (h.batch / cores)).toFixed(1)}x HF batch/core`);
    console.log(`  Go       parallel (${cores} cores)      ${M(g.parallel)}   ${(g.parallel / h.batch).toFixed(1)}x HF encodeBatch`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
