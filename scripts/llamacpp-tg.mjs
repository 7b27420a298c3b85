// llama.cpp's decode speed on a GGUF file, for a side-by-side run with
// sinkd-bench on the same machine (doc/performance.md). llama.cpp comes
// from node-llama-cpp's prebuilt CPU binaries (npm; no compiler, no
// network beyond the npm registry), installed outside the tree:
//
//   mkdir /tmp/nlc && (cd /tmp/nlc && npm install node-llama-cpp@3.22.1)
//   NODE_LLAMA_CPP=/tmp/nlc/node_modules/node-llama-cpp/dist/index.js \
//     node scripts/llamacpp-tg.mjs MODEL THREADS [GEN=128] [REPS=3]
//
// Prints one JSON line: the median over REPS of greedy decode tokens/s
// after a 16-token prompt, (GEN - 1) / (last token - first token), as
// sinkd-bench measures a session. Each token passes through the binding's
// JavaScript (an async generator), a fixed cost per token of about 2 ms
// on the project's machine (stories15M Q8_0 decodes at ~350 tokens/s here
// against ~1230 for llama-bench on the reference page): only the larger
// shapes (stories110M, whose token takes 5-50 ms) compare the engines.
const {getLlama} = await import(process.env.NODE_LLAMA_CPP || "node-llama-cpp");
const [modelPath, threadsArg, genArg, repsArg] = process.argv.slice(2);
if (!modelPath || !threadsArg) {
  console.error("usage: node llamacpp-tg.mjs MODEL THREADS [GEN] [REPS]");
  process.exit(2);
}
const threads = Number(threadsArg), gen = Number(genArg || 128), reps = Number(repsArg || 3);
const llama = await getLlama({gpu: false, build: "never", maxThreads: 0, logLevel: "error"});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const ctx = await model.createContext({contextSize: 256, batchSize: 512, threads,
                                      flashAttention: true}); // as llama-bench
const rates = [];
for (let r = 0; r < reps; r++) {
  const seq = ctx.getSequence();
  const prompt = [1];
  for (let i = 1; i < 16; i++) prompt.push(259 + ((r * 977 + i * 131) % 30000));
  const t = [];
  for await (const token of seq.evaluate(prompt, {temperature: 0})) {
    void token;
    t.push(performance.now());
    if (t.length >= gen) break;
  }
  rates.push((t.length - 1) / ((t[t.length - 1] - t[0]) / 1000));
  seq.dispose();
}
rates.sort((a, b) => a - b);
console.log(JSON.stringify({model: modelPath, threads, gen, reps,
                            decode_tokens_per_s: rates[Math.floor(rates.length / 2)], all: rates}));
await ctx.dispose();
await model.dispose();
await llama.dispose();
