// The official OpenAI JavaScript SDK against sinkd's HTTP endpoint (run
// by test-http.py, which installed the package under SK_NPM_DIR): a
// non-streamed completion and a streamed one (and a streamed chat
// completion when the daemon has chat templates). Prints one JSON line
// of what it got, which test-http.py checks against sinkd's own figures.
import { createRequire } from 'node:module';

const require = createRequire(process.env.SK_NPM_DIR + '/');
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: process.env.SK_BASE_URL, apiKey: process.env.SK_KEY });

const completion = await client.completions.create({
  model: 'stories260K', prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
});
const out = {
  completion: { text: completion.choices[0].text, usage: completion.usage,
                finish_reason: completion.choices[0].finish_reason },
};

const stream = await client.completions.create({
  model: 'stories260K', prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
  stream: true, stream_options: { include_usage: true },
});
let text = '', usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.choices.length) {
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  if (chunk.usage) usage = chunk.usage;
}
out.stream = { text, usage, finish_reason: finish };

if (process.env.SK_CHAT) {
  const chat = await client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: 'Tell me a story.' }],
    max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let ctext = '', cusage = null, cfinish = null;
  for await (const chunk of chat) {
    if (chunk.choices.length) {
      ctext += chunk.choices[0].delta.content ?? '';
      if (chunk.choices[0].finish_reason) cfinish = chunk.choices[0].finish_reason;
    }
    if (chunk.usage) cusage = chunk.usage;
  }
  out.chat = { text: ctext, usage: cusage, finish_reason: cfinish };
}
console.log(JSON.stringify(out));
