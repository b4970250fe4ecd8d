// The official openai Node SDK's chat surface against the gateway: a completion, a stream with its usage
// chunk, tool calls plain and streamed (reassembled by hand and by the SDK's own stream helper), a tool
// result sent back, and a refused field. Run by tests/clients/test_node_sdk.py with GATEWAY_URL (the /v1
// base), GATEWAY_KEY and GATEWAY_MODEL; prints one JSON object with what the SDK returned.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.GATEWAY_URL,
  apiKey: process.env.GATEWAY_KEY,
  maxRetries: 0,
  timeout: 15000,
});
const model = process.env.GATEWAY_MODEL;
const messages = [
  { role: "system", content: "Answer briefly." },
  { role: "user", content: "What is 2 + 2?" },
];
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "kelvin"] } },
        required: ["city", "unit"],
      },
    },
  },
];

const plain = await client.chat.completions.create({ model, messages, max_tokens: 8, seed: 7 });

const stream = await client.chat.completions.create({
  model,
  messages,
  max_tokens: 8,
  seed: 7,
  stream: true,
  stream_options: { include_usage: true },
});
const chunks = [];
for await (const chunk of stream) chunks.push(chunk);

const toolPlain = await client.chat.completions.create({ model, messages, tools, tool_choice: "auto" });

const toolStream = await client.chat.completions.create({ model, messages, tools, stream: true });
const calls = {};
let toolFinish = null;
for await (const chunk of toolStream) {
  for (const choice of chunk.choices) {
    toolFinish = choice.finish_reason ?? toolFinish;
    for (const d of choice.delta.tool_calls ?? []) {
      const slot = (calls[d.index] ??= { id: "", name: "", arguments: "", pieces: 0 });
      slot.id += d.id ?? "";
      slot.name += d.function?.name ?? "";
      slot.arguments += d.function?.arguments ?? "";
      slot.pieces += 1;
    }
  }
}

const helper = client.chat.completions.stream({ model, messages, tools });
const helperFinal = await helper.finalChatCompletion();

const call = toolPlain.choices[0].message.tool_calls[0];
const answered = await client.chat.completions.create({
  model,
  tools,
  messages: [...messages, toolPlain.choices[0].message, { role: "tool", tool_call_id: call.id, content: "21 degrees" }],
});

let error = null;
try {
  await client.chat.completions.create({ model, messages, temperature: 9 });
} catch (e) {
  error = { name: e.constructor.name, status: e.status, param: e.param ?? null, code: e.code ?? null };
}

console.log(
  JSON.stringify({ plain, chunks, toolPlain, calls, toolFinish, helperFinal, answered, error }),
);
