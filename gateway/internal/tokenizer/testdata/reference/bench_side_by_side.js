// Side-by-side throughput: HF's Rust tokenizers (npm "tokenizers", napi binding) and kvgate's Go tokenizer
// on the same 1 MB text (../goldens/bench.txt.gz), in the same run.
//
// Usage (from this folder, after `npm ci`): node bench_side_by_side.js [--runs N] [model ...]
// Models default to qwen3 and llama3_1, read from $KVGATE_MODELS_DIR or <repo>/.cache/models.
//
// HF side, per model: the whole text in one encode() call (median of N runs after a warm-up), and the text
// cut after line ends into ~4 KB chunks passed to encodeBatch() (rayon: all cores) and, for reference, to
// encode() one by one. Go side: `go test -bench BenchmarkEncode/<model>/` in gateway/internal/tokenizer (cold =
// empty word cache, warm = word cache filled from the golden corpus, a different text; parallel = ~4 KB
// chunks from GOMAXPROCS goroutines), median of N runs. Ratios: Go per core vs HF single encode, and Go
// per core vs HF encodeBatch per core (encodeBatch throughput / cores).
//
// Two columns: wall-clock tokens/s, and tokens per CPU-second (HF: process.cpuUsage() around the calls,
// all threads; Go: the benchmarks' tok/cpu-s). On a shared machine the wall clock also counts time other
// processes held the cores; CPU time does not, so the CPU-based ratios are the ones to compare.
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
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };

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
  const single = [], singleCPU = [];
  for (let i = 0; i < runs; i++) {
    const t0 = now(), c0 = cpu();
    await tok.encode(text, null, opts);
    single.push(n / (now() - t0)); singleCPU.push(n / (cpu() - c0));
  }
  const parts = chunks(text, 4000);
  await tok.encodeBatch(parts, opts);
  const batch = [], batchCPU = [], seq = [];
  for (let i = 0; i < runs; i++) {
    let t0 = now(), c0 = cpu(); let tot = 0;
    for (const e of await tok.encodeBatch(parts, opts)) tot += e.getIds().length;
    batch.push(tot / (now() - t0)); batchCPU.push(tot / (cpu() - c0));
    t0 = now(); tot = 0;
    for (const p of parts) tot += (await tok.encode(p, null, opts)).getIds().length;
    seq.push(tot / (now() - t0));
  }
  return { tokens: n, single: median(single), singleCPU: median(singleCPU), batch: median(batch),
    batchCPU: median(batchCPU), seq: median(seq), chunks: parts.length };
}

function goBench(root, model, runs) {
  const env = { ...process.env, GOTOOLCHAIN: process.env.GOTOOLCHAIN || 'go1.27.3', GOFLAGS: '-buildvcs=false' };
  const out = execFileSync('go', ['test', '-run', '^$', '-bench', `^BenchmarkEncode$/^${model}$/`, '-benchtime', '10x',
    '-count', String(runs), './gateway/internal/tokenizer'], { cwd: root, env, encoding: 'utf8', maxBuffer: 1 << 24 });
  const res = {};
  for (const line of out.split('\n')) {
    const name = line.match(/^BenchmarkEncode\/[^/]+\/(\w+)-\d+\s/);
    if (!name) continue;
    for (const [unit, key] of [['tok/s', name[1]], ['tok/cpu-s', name[1] + 'CPU']]) {
      const m = line.match(new RegExp('([\\d.]+) ' + unit.replace('/', '\\/') + '(\\s|$)'));
      if (m) (res[key] = res[key] || []).push(+m[1]);
    }
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
    const r = (a, b) => (a / b).toFixed(1) + 'x';
    console.log(`\n${m} (${h.tokens} tokens)          wall M tok/s    M tok per CPU-s`);
    console.log(`  HF Rust  encode(1 MB)            ${M(h.single).padStart(6)}          ${M(h.singleCPU).padStart(6)}`);
    console.log(`  HF Rust  encode x ${h.chunks} chunks     ${M(h.seq).padStart(6)}`);
    console.log(`  HF Rust  encodeBatch (${cores} cores)    ${M(h.batch).padStart(6)}          ${M(h.batchCPU).padStart(6)}  (= per core)`);
    for (const k of ['cold', 'warm']) {
      console.log(`  Go       ${k}, 1 core             ${M(g[k]).padStart(6)}          ${M(g[k + 'CPU']).padStart(6)}` +
        `   CPU-based: ${r(g[k + 'CPU'], h.singleCPU)} HF encode, ${r(g[k + 'CPU'], h.batchCPU)} HF encodeBatch per core`);
    }
    console.log(`  Go       parallel (${cores} cores)       ${M(g.parallel).padStart(6)}          ${M(g.parallelCPU).padStart(6)}` +
      `   wall: ${r(g.parallel, h.batch)} HF encodeBatch`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
