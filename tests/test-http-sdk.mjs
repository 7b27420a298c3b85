// The official OpenAI JavaScript SDK against sinkd's HTTP endpoint (run
// by test-http.py, which installed the package under SK_NPM_DIR): a
// non-streamed completion and a streamed one, and when the daemon has
// chat templates (SK_CHAT) chat completions as OpenAI clients send them:
// streamed, with a system message (streamed and not), with the
// developer role, a multi-turn conversation on a persistent session,
// logprobs and top_logprobs (chat and completions, streamed and not),
// and a field sinkd does not take. Prints one JSON line of what it got,
// which test-http.py checks against sinkd's own figures.
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

  const model = 'stories260K';
  const SYS = 'You are a helpful assistant.';
  const user = { role: 'user', content: 'Tell me a story.' };
  const text = (r) => r.choices[0].message.content;
  // A system message, not streamed and streamed, and the developer role.
  const sys1 = await client.chat.completions.create({
    model, messages: [{ role: 'system', content: SYS }, user], max_tokens: 12, temperature: 0,
  });
  out.system = { text: text(sys1), usage: sys1.usage };
  const sys2 = await client.chat.completions.create({
    model, messages: [{ role: 'system', content: SYS }, user], max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let stext = '', susage = null;
  for await (const chunk of sys2) {
    if (chunk.choices.length) stext += chunk.choices[0].delta.content ?? '';
    if (chunk.usage) susage = chunk.usage;
  }
  out.system_stream = { text: stext, usage: susage };
  const dev = await client.chat.completions.create({
    model, messages: [{ role: 'developer', content: SYS }, user], max_tokens: 12, temperature: 0,
  });
  out.developer = { text: text(dev), usage: dev.usage };

  // A conversation on a persistent session ("session" is sinkd's field):
  // each request carries the whole conversation, as OpenAI clients send it.
  const conv = [{ role: 'system', content: SYS }, user];
  const turn1 = await client.chat.completions.create({
    model, messages: conv, max_tokens: 8, temperature: 0, session: 'new',
  });
  const session = turn1.sinkd.session;
  conv.push(turn1.choices[0].message, { role: 'user', content: 'And then?' });
  const turn2 = await client.chat.completions.create({
    model, messages: conv, max_tokens: 8, temperature: 0, session,
  });
  out.multi = { session, turn1: text(turn1), turn2: text(turn2), usage2: turn2.usage,
                seen2: turn2.sinkd.seen };

  // logprobs: chat, not streamed and streamed; completions likewise.
  const lp1 = await client.chat.completions.create({
    model, messages: [user], max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  out.chat_logprobs = { text: text(lp1), logprobs: lp1.choices[0].logprobs };
  const lp2 = await client.chat.completions.create({
    model, messages: [user], max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3,
    stream: true,
  });
  const content = [];
  for await (const chunk of lp2) {
    if (chunk.choices.length && chunk.choices[0].logprobs)
      content.push(...chunk.choices[0].logprobs.content);
  }
  out.chat_logprobs_stream = content;
  const cl1 = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, logprobs: 2,
  });
  out.completion_logprobs = { text: cl1.choices[0].text, logprobs: cl1.choices[0].logprobs };
  const cl2 = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, logprobs: 2, stream: true,
  });
  const parts = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for await (const chunk of cl2) {
    const l = chunk.choices.length ? chunk.choices[0].logprobs : null;
    if (l) for (const k of Object.keys(parts)) parts[k].push(...l[k]);
  }
  out.completion_logprobs_stream = parts;

  // A field sinkd does not take: 400 naming it.
  try {
    await client.chat.completions.create({
      model, messages: [user], max_tokens: 4,
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
    });
    out.tools = { status: 200 };
  } catch (e) {
    out.tools = { status: e.status, message: e.error?.message ?? e.message };
  }
}
console.log(JSON.stringify(out));
