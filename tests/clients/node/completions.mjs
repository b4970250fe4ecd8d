// The official openai Node SDK against the gateway: a completion, a stream and a refused field.
// Run by tests/clients/test_node_sdk.py with GATEWAY_URL (the /v1 base), GATEWAY_KEY, GATEWAY_MODEL and
// GATEWAY_PROMPT; prints one JSON object with what the SDK returned.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.GATEWAY_URL,
  apiKey: process.env.GATEWAY_KEY,
  maxRetries: 0,
  timeout: 15000,
});
const model = process.env.GATEWAY_MODEL;
const prompt = process.env.GATEWAY_PROMPT;

const plain = await client.completions.create({ model, prompt, max_tokens: 12, logprobs: 1 });

const stream = await client.completions.create({
  model,
  prompt,
  max_tokens: 12,
  stream: true,
  stream_options: { include_usage: true },
});
const chunks = [];
for await (const chunk of stream) chunks.push(chunk);

let error = null;
try {
  await client.completions.create({ model, prompt, temperature: 9 });
} catch (e) {
  error = { name: e.constructor.name, status: e.status, param: e.param ?? null, code: e.code ?? null };
}

console.log(JSON.stringify({ plain, chunks, error }));
