#!/usr/bin/env python3
"""Concurrent decode through llama.cpp's llama-server, measured as
sinkd-bench measures sinkd's (tools/sinkd-bench.c, its concurrency part):
N clients, each with its own connection, send the same 16-token prompts
(sinkd-bench's random tokens) at once and stream --gen greedy tokens
(EOS ignored); aggregate = (all tokens - N) / (last token event - first
token event), and the p50 / p99 of every gap between two token events of
one client (tokens that arrive in one event, a character cut between
them, count with a gap of 0). One JSON object on stdout, the keys of
sinkd-bench --json's "concurrency" entries.

  llama-server-bench.py --port PORT --sessions N [--gen 128] [--n-vocab V]

(--n-vocab: the model's vocabulary, which the prompts are drawn from;
default: the server's, from /v1/models.)

The server must run with at least N slots (llama-server -np N) and a
context of N x (16 + gen) tokens or more. Python's standard library only.
"""
import argparse
import http.client
import json
import math
import sys
import threading
import time

PROMPT_TOKENS = 16
FIRST_NORMAL_ID = 259  # after <unk> <s> </s> and the 256 byte tokens


def random_tokens(n, n_vocab, state):
    """sinkd-bench's random_tokens: the same ids for the same state."""
    span = n_vocab - FIRST_NORMAL_ID if n_vocab > FIRST_NORMAL_ID else n_vocab
    base = FIRST_NORMAL_ID if n_vocab > FIRST_NORMAL_ID else 0
    out = []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(base + (state >> 33) % span)
    return out, state


def quantile(v, q):
    """sinkd-bench's quantile: the ceil(q n)-th smallest."""
    if not v:
        return 0.0
    v = sorted(v)
    i = math.ceil(q * len(v))
    return v[max(i, 1) - 1]


def client(port, prompt, gen, ready, times, errors):
    body = json.dumps({
        "prompt": prompt, "n_predict": gen, "stream": True, "ignore_eos": True,
        "temperature": 0.0, "top_k": 1, "cache_prompt": False, "return_tokens": True,
    })
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    try:
        conn.connect()
        ready.wait()
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            errors.append(f"HTTP {resp.status}: {resp.read()[:200]!r}")
            return
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[6:])
            now = time.monotonic()
            # an event carries the tokens whose text is complete (a
            # character cut between two tokens waits for the second)
            for _ in ev.get("tokens", []):
                times.append(now)
            if ev.get("stop"):
                break
    except (OSError, http.client.HTTPException, ValueError) as e:
        errors.append(str(e))
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--sessions", type=int, required=True)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--n-vocab", type=int)
    a = ap.parse_args()
    if a.n_vocab is None:
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
        conn.request("GET", "/v1/models")
        a.n_vocab = json.loads(conn.getresponse().read())["data"][0]["meta"]["n_vocab"]
        conn.close()
    ready = threading.Barrier(a.sessions + 1)
    times = [[] for _ in range(a.sessions)]
    errors = []
    threads = []
    for i in range(a.sessions):
        prompt, _ = random_tokens(PROMPT_TOKENS, a.n_vocab, 1000 + i)
        t = threading.Thread(target=client, args=(a.port, prompt, a.gen, ready, times[i], errors))
        t.start()
        threads.append(t)
    ready.wait()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"llama-server-bench: {errors[0]}")
    first = min(t[0] for t in times if t)
    last = max(t[-1] for t in times if t)
    tokens = sum(len(t) - 1 for t in times if t)
    gaps = [(t[k] - t[k - 1]) * 1e3 for t in times for k in range(1, len(t))]
    print(json.dumps({
        "sessions": a.sessions,
        "aggregate_tokens_per_s": round(tokens / (last - first), 2) if last > first else 0.0,
        "itl_p50_ms": round(quantile(gaps, 0.5), 3),
        "itl_p99_ms": round(quantile(gaps, 0.99), 3),
        "tokens": [len(t) for t in times],
    }))


if __name__ == "__main__":
    main()
