// Node's official openai client against a running kvgate (tests/e2e TestOpenAISurfaceNode).
// Usage: node surface.mjs BASE_URL MODEL INSTRUCTIONS QUESTION
// Prints one JSON object with what each route answered; the Go test asserts on it. Exits 1 on an
// unexpected exception.
import OpenAI from 'openai';

const [base, model, instructions, question] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const root = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const out = {};

const m = await client.models.retrieve(model);
out.model = { id: m.id, object: m.object, owned_by: m.owned_by };
try {
  await client.models.retrieve('no-such/model');
  out.missing = { status: 200 };
} catch (e) {
  out.missing = { status: e.status, code: e.code, type: e.type, message: e.message };
}

const ask = () => client.responses.create({ model, instructions, input: question, max_output_tokens: 5 }).withResponse();
const a = await ask();
const b = await ask();
out.responses = [a, b].map(({ data, response }) => ({
  endpoint: response.headers.get('x-kvgate-endpoint'),
  routing: response.headers.get('x-kvgate-routing'),
  status: data.status,
  text: data.output_text,
  input_tokens: data.usage.input_tokens,
  cached_tokens: data.usage.input_tokens_details.cached_tokens,
  output_tokens: data.usage.output_tokens,
}));

const { data: stream, response: sresp } = await client.responses
  .create({
    model,
    input: [
      { role: 'system', content: instructions },
      { role: 'user', content: [{ type: 'input_text', text: question }] },
    ],
    stream: true,
  })
  .withResponse();
const types = [];
let deltas = '';
let final = null;
for await (const ev of stream) {
  types.push(ev.type);
  if (ev.type === 'response.output_text.delta') deltas += ev.delta;
  if (ev.type === 'response.completed') final = ev.response;
}
out.stream = {
  endpoint: sresp.headers.get('x-kvgate-endpoint'),
  routing: sresp.headers.get('x-kvgate-routing'),
  types,
  deltas,
  // The stream's response object has no output_text convenience property: read the message item.
  text: final && final.output.map((it) => it.content.map((p) => p.text).join('')).join(''),
  cached_tokens: final && final.usage.input_tokens_details.cached_tokens,
};

// The Node SDK asks for base64 embeddings by default and decodes them to floats.
const { data: emb, response: eresp } = await client.embeddings
  .create({ model, input: ['alpha river', 'cobalt granite lantern'] })
  .withResponse();
out.embeddings = {
  routing: eresp.headers.get('x-kvgate-routing'),
  reason: eresp.headers.get('x-kvgate-routing-reason'),
  count: emb.data.length,
  dims: emb.data[0].embedding.length,
  norm2: emb.data[0].embedding.reduce((s, x) => s + x * x, 0),
};

const tok = await root.post('/tokenize', { body: { model, prompt: 'Hello, world! How are you?' } });
const detok = await root.post('/detokenize', { body: { model, tokens: tok.tokens } });
out.tokenize = { tokens: tok.tokens, count: tok.count, detokenized: detok.prompt };

console.log(JSON.stringify(out));
