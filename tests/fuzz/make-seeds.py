#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/.

The seeds are committed; this script says how they were made and remakes
them (python3 only, no packages: msgpack and GGUF are written by hand).

  frame/      byte 0 = mode (frame limit, read cuts), then request frames
  server/     the byte stream of one client: requests of every op
  gguf/       tiny llama models (a few KiB), valid and subtly broken
  tokenizer/  byte 0 = mode, then text (or int32 ids with bit 7 set);
              bit 1: a BPE vocabulary (bit 3: Qwen2's), bit 2: parse_special
  http/       byte 0 = mode (body limit, read cuts), then HTTP requests
  config/     sinkd.conf files: the example, every key, and broken ones
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


# ---- msgpack, the subset requests use ---------------------------------

def mp(v):
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if 0 <= v < 1 << 8:
            return b"\xcc" + struct.pack(">B", v)
        if 0 <= v < 1 << 16:
            return b"\xcd" + struct.pack(">H", v)
        if 0 <= v < 1 << 32:
            return b"\xce" + struct.pack(">I", v)
        if 0 <= v:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32:
            return bytes([0xA0 | len(b)]) + b
        if len(b) < 256:
            return b"\xd9" + bytes([len(b)]) + b
        return b"\xda" + struct.pack(">H", len(b)) + b
    if isinstance(v, (bytes, bytearray)):
        return b"\xc4" + bytes([len(v)]) + bytes(v)
    if isinstance(v, list):
        h = bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))
        return h + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        h = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))
        return h + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)


def frame(obj):
    body = obj if isinstance(obj, bytes) else mp(obj)
    return struct.pack(">I", len(body)) + body


def req(i, op, **kw):
    d = {"id": i, "op": op}
    d.update(kw)
    return frame(d)


def streams():
    """Named client byte streams (no mode byte)."""
    s = {}
    s["ping"] = req(1, "ping")
    s["hello"] = req(1, "hello")
    s["list-stats"] = req(1, "list") + req(2, "stats")
    s["tokenize"] = req(1, "tokenize", text="Once upon a time", bos=False)
    s["detokenize"] = req(1, "detokenize", tokens=[1, 403, 407, 261, 378])
    s["open-dense"] = req(1, "open", policy="dense", capacity=32)
    s["open-streaming"] = req(1, "open", policy="streaming", n_sink=4, window=28)
    s["session-life"] = (req(1, "open") + req(2, "append", session=1, text="Once upon a time")
                         + req(3, "generate", session=1, max_tokens=4, temperature=0.0)
                         + req(4, "stats", session=1) + req(5, "list")
                         + req(6, "close", session=1))
    s["generate-all-params"] = (req(1, "open", policy="streaming", n_sink=2, window=30)
                                + req(2, "generate", session=1, prompt="The cat", max_tokens=8,
                                      temperature=0.7, top_k=40, top_p=0.9, seed=42,
                                      ignore_eos=True, n_top=3, stop=["\n", "."], bos=True))
    s["generate-tokens"] = (req(1, "open") + req(2, "generate", session=1,
                                                 tokens=[1, 403, 407], max_tokens=3))
    s["cancel"] = (req(1, "open") + req(2, "generate", session=1, prompt="x",
                                        max_tokens=1000) + req(3, "cancel", session=1))
    s["dense-full"] = (req(1, "open", policy="dense", capacity=4)
                       + req(2, "append", session=1, tokens=[1, 2, 3, 4, 5]))
    s["errors"] = (req(1, "nope") + req(2, "append", session=99, text="x")
                   + frame(b"\x91\x01") + frame(b"") + frame(b"\xdd\xff\xff\xff\xff")
                   + req(3, "open", window="big"))
    s["too-large"] = struct.pack(">I", 70000) + b"\x00" * 100 + req(1, "ping")
    s["pipelined"] = b"".join(req(i, "ping") for i in range(1, 20))
    s["split-header"] = req(1, "ping")[:2]
    s["policies"] = (req(1, "open", policy="h2o", heavy=8, recent=8)
                     + req(2, "open", policy="sink_h2o", n_sink=2, heavy=6, recent=8,
                           rope_scale=0.5)
                     + req(3, "open", policy="window", window=16)
                     + req(4, "open", policy="streaming", window=12, pin="Once upon")
                     + req(5, "append", session=1, text="The cat sat", logprobs=True)
                     + req(6, "generate", session=2, prompt="A dog", max_tokens=4)
                     + req(7, "stats", session=2, tokens=True)
                     + req(8, "fork", session=1) + req(9, "export", session=3)
                     + req(10, "resume", session=4))
    return s


def write(folder, name, data):
    d = os.path.join(OUT, folder)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- GGUF -----------------------------------------------------------------

def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gkv(key, typ, val):
    out = gstr(key) + struct.pack("<I", typ)
    if typ == 4:
        out += struct.pack("<I", val)
    elif typ == 5:
        out += struct.pack("<i", val)
    elif typ == 6:
        out += struct.pack("<f", val)
    elif typ == 7:
        out += bytes([1 if val else 0])
    elif typ == 8:
        out += gstr(val)
    elif typ == 9:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            if et == 8:
                out += gstr(it)
            elif et == 6:
                out += struct.pack("<f", it)
            elif et == 5:
                out += struct.pack("<i", it)
    return out


def tiny_model(dim=8, hidden=16, n_layer=1, n_head=2, n_kv_head=1, ctx=32, align=None,
               tied=False, f16=False, extra_tokens=(), user_defined=()):
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = ["\u2581", "\u2581a", "a", "b", "\u2581the", "th", "e", "\u2581c", "at"]
    words += list(extra_tokens)
    tokens += words
    types += [1] * len(words)
    for u in user_defined:
        tokens.append(u)
        types.append(4)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    n_vocab = len(tokens)
    head_dim = dim // n_head
    kv_dim = n_kv_head * head_dim
    kvs = [
        gkv("general.architecture", 8, "llama"),
        gkv("general.name", 8, "tiny"),
        gkv("llama.context_length", 4, ctx),
        gkv("llama.embedding_length", 4, dim),
        gkv("llama.feed_forward_length", 4, hidden),
        gkv("llama.block_count", 4, n_layer),
        gkv("llama.attention.head_count", 4, n_head),
        gkv("llama.attention.head_count_kv", 4, n_kv_head),
        gkv("llama.rope.dimension_count", 4, head_dim),
        gkv("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
        gkv("tokenizer.ggml.model", 8, "llama"),
        gkv("tokenizer.ggml.tokens", 9, (8, tokens)),
        gkv("tokenizer.ggml.scores", 9, (6, scores)),
        gkv("tokenizer.ggml.token_type", 9, (5, types)),
        gkv("tokenizer.ggml.bos_token_id", 4, 1),
        gkv("tokenizer.ggml.eos_token_id", 4, 2),
    ]
    if align is not None:
        kvs.append(gkv("general.alignment", 4, align))
    a = align or 32
    tensors = [("token_embd.weight", [dim, n_vocab]), ("output_norm.weight", [dim])]
    if not tied:
        tensors.append(("output.weight", [dim, n_vocab]))
    for layer in range(n_layer):
        for suffix, shape in [("attn_norm", [dim]), ("attn_q", [dim, dim]),
                              ("attn_k", [dim, kv_dim]), ("attn_v", [dim, kv_dim]),
                              ("attn_output", [dim, dim]), ("ffn_norm", [dim]),
                              ("ffn_gate", [dim, hidden]), ("ffn_up", [dim, hidden]),
                              ("ffn_down", [hidden, dim])]:
            tensors.append(("blk.%d.%s.weight" % (layer, suffix), shape))
    esize = 2 if f16 else 4
    infos = b""
    data = b""
    for k, (name, shape) in enumerate(tensors):
        n = 1
        for d in shape:
            n *= d
        off = len(data)
        infos += gstr(name) + struct.pack("<I", len(shape))
        infos += b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", 1 if f16 else 0, off)
        # Small deterministic weights; norms at 1.
        if name.endswith("norm.weight"):
            vals = [1.0] * n
        else:
            vals = [((i * 7919 + k * 104729) % 2001 - 1000) / 4000.0 for i in range(n)]
        fmt = "<%de" % n if f16 else "<%df" % n
        data += struct.pack(fmt, *vals)
        data += b"\x00" * ((-len(data)) % a)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    head += b"\x00" * ((-len(head)) % a)
    return head + data


def main():
    for name, s in streams().items():
        write("server", name, s)
        for mode in (0, 1, 2, 3, 0x45):
            write("frame", "%s-%02x" % (name, mode), bytes([mode]) + s)
    # GGUF: valid variants, and a few one step from valid.
    write("gguf", "tiny", tiny_model())
    write("gguf", "tiny-tied", tiny_model(tied=True))
    write("gguf", "tiny-f16", tiny_model(f16=True))
    write("gguf", "tiny-align64", tiny_model(align=64))
    write("gguf", "tiny-2layers-gqa", tiny_model(n_layer=2, n_head=4, n_kv_head=2))
    write("gguf", "tiny-user-defined", tiny_model(user_defined=["<|im_start|>", "ab"]))
    m = tiny_model()
    write("gguf", "tiny-cut-header", m[:200])
    write("gguf", "tiny-cut-data", m[: len(m) - 40])
    write("gguf", "empty", b"")
    write("gguf", "magic-only", b"GGUF")
    # Tokenizer: text (modes 0/1 = without/with BOS) and ids (0x80, 0xc0).
    texts = {
        "story": "Once upon a time, there was a little girl named Lily.",
        "spaces": "  two  spaces and\ttabs\nnewline ",
        "utf8": "caf\u00e9 \u65e5\u672c \U0001F600 \u2581mark",
        "bytes": b"\xff\xfe\x00\xc3\x28\xe2\x82",
        "empty": "",
        "special": "<s></s><unk> <0x41>",
    }
    for name, t in texts.items():
        b = t.encode() if isinstance(t, str) else t
        write("tokenizer", name + "-nobos", b"\x00" + b)
        write("tokenizer", name + "-bos", b"\x01" + b)
        write("tokenizer", name + "-bpe", b"\x02" + b)
        write("tokenizer", name + "-bpe-special", b"\x06" + b)
        write("tokenizer", name + "-qwen2", b"\x0a" + b)
    chat = "<|im_start|>user\nhi<|im_end|>\n<|begin_of_text|><|eot_id|>[PAD151650]"
    write("tokenizer", "chat-qwen2-special", b"\x0e" + chat.encode())
    write("tokenizer", "chat-bpe-special", b"\x06" + chat.encode())
    write("tokenizer", "chat-bpe", b"\x02" + chat.encode())
    write("tokenizer", "digits-bpe", b"\x02" + b"1234567 3.14159 'll 've IT'S\r\n\r\n   x")
    ids = struct.pack("<6i", 1, 403, 407, 261, 378, 2)
    write("tokenizer", "ids", b"\x80" + ids)
    write("tokenizer", "ids-mod", b"\xc0" + ids + struct.pack("<2i", -5, 100000))
    write("tokenizer", "ids-bad", b"\x80" + struct.pack("<3i", 5, 512, -1))
    write("tokenizer", "ids-bpe", b"\x82" + struct.pack("<6i", 128000, 9906, 1917, 128009, 220, 128255))
    write("tokenizer", "ids-qwen2-mod", b"\xca" + ids + struct.pack("<2i", -5, 151645))
    for name, data in http_requests().items():
        write("http", name, b"\x02" + data)         # 64 KiB bodies, whole reads
        write("http", name + "-cut", b"\x1d" + data)  # 1 KiB bodies, 7 cuts
    with open(os.path.join(HERE, "..", "..", "daemon", "sinkd.conf"), "rb") as f:
        write("config", "example", f.read())
    for name, data in configs().items():
        write("config", name, data)
    return 0


def configs():
    """Named configuration files: every key with a value, and mistakes."""
    s = {}
    s["every-key"] = (
        b"[daemon]\nmodel = /var/lib/sinkd/model.gguf\nsocket = /run/sinkd/sinkd.sock\n"
        b"state_dir = /run/sinkd/state\nthreads = auto\nbatch = 64\nlog_level = debug\n"
        b"kv_type = f32\nchat_template = chatml\nhttp_socket = none\n"
        b"http_listen = [::1]:8080\nhttp_listen_public = no\nhttp_key_file = /etc/sinkd/key\n"
        b"http_uid = 1000\nsparsity_file = /var/lib/sinkd/sparsity.txt\n"
        b"[session]\npolicy = sink_h2o\nsinks = 4\nwindow = auto\ncapacity = 2048\n"
        b"[limits]\nmax_clients = 1024\nmax_sessions = 64\nmax_capacity = auto\n"
        b"max_memory = 4G\nmax_user_sessions = 16\nmax_user_memory = 1536M\n"
        b"max_frame = 1M\nidle_ttl = 0\nmax_user_clients = 128\nframe_timeout = 30\n"
        b"max_input_memory = auto\nmax_user_input_memory = 64M\n")
    s["mistakes"] = (
        b"\xef\xbb\xbf; a BOM, then a comment\nmodel = /x\n[limits]\nmax_sessions = lots\n"
        b"max_sesions = 3\nsinks = 4\nmax_memory = 1T\nmax_memory = 2G\n[nope]\na = b\n"
        b"just words\n  indented = yes\n[daemon]\nhttp_listen = 0.0.0.0:80x\n"
        b"http_listen_public = maybe\nmodel = a\x00b\n")
    s["crlf"] = b"[daemon]\r\nmodel = /m.gguf\r\n[limits]\r\nmax_frame = 64K\r\n"
    s["long-line"] = b"[daemon]\nmodel = /" + b"a" * 300 + b"\n"
    s["empty"] = b""
    return s


def http_requests():
    """Named HTTP client byte streams (no mode byte)."""
    def post(body, path=b"/v1/completions", extra=b""):
        return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + extra +
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body)
    s = {}
    s["get-health"] = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    s["completion"] = post(b'{"model":"m","prompt":"Once upon a time","max_tokens":16,'
                           b'"temperature":0.7,"top_p":0.9,"seed":3,"stop":["\\n","."],'
                           b'"stream":true,"stream_options":{"include_usage":true}}')
    s["chat"] = post(b'{"messages":[{"role":"system","content":"Be brief."},'
                     b'{"role":"user","content":"Hi"}],"max_completion_tokens":8,'
                     b'"session":"new","policy":"window","window":16}',
                     b"/v1/chat/completions")
    s["session-id"] = post(b'{"prompt":" and","session":7,"n":1}',
                           extra=b"Authorization: Bearer sk-0123456789abcdef\r\n")
    s["chunked"] = (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\n{\"pro\r\nf\r\nmpt\": \"x\", \"n\":\r\n2\r\n2}\r\n0\r\n\r\n")
    s["expect"] = post(b'{"prompt":"x"}', extra=b"Expect: 100-continue\r\n")
    s["pipelined"] = (s["get-health"] + post(b'{"prompt":"a"}') +
                      b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n")
    s["bad-json"] = post(b'{"prompt": [1, {"a": "b"}], "max_tokens": -1, "temperature": "x"}')
    s["bad-chunk"] = (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"zz\r\n")
    s["http10"] = b"GET /metrics HTTP/1.0\r\n\r\n"
    return s


if __name__ == "__main__":
    sys.exit(main())
