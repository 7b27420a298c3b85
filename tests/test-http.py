#!/usr/bin/python3
"""The HTTP endpoint (sinkd-http(7)) against a live daemon on the test
model (httpfixture.py): completions and chat with curl against sinkd's
own figures, conversations, the system prompt, the TCP listener's API
key, socket activation, and the official OpenAI JavaScript SDK
(installed with npm into the build folder: SK_NPM_DIR). Hostile
requests, cancels, load and limits: test-http-hostile.py.

Environment (from meson): SK_SINKD, SK_MODEL, SK_PYTHON_DIR, SK_NPM_DIR,
SK_MKMODEL, SK_QWEN2_VOCAB.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # nothing written into the checkout
import httpfixture  # noqa: E402
import sinkd  # noqa: E402
from httpfixture import (KEY, MODEL, PROMPT, SINKD, STORY, Daemon, curl, free_port, open_to_all,
                         own_generate, raw, sse, status_of, tearDownModule)  # noqa: E402


def setUpModule():
    global D
    httpfixture.setUpModule()
    D = httpfixture.D


class Completions(unittest.TestCase):
    def test_models_health(self):
        code, body_models = curl("http://x/v1/models")
        self.assertEqual(code, 200)
        self.assertEqual(json.loads(body_models)["data"][0]["id"], "stories260K")
        # OpenAI's "retrieve model": the served one, 404 for others.
        code, body = curl("http://x/v1/models/stories260K")
        self.assertEqual((code, json.loads(body)), (200, json.loads(body_models)["data"][0]))
        code, body = curl("http://x/v1/models/gpt-4o")
        self.assertEqual(code, 404)
        self.assertEqual(json.loads(body)["error"]["message"],
                         "no model 'gpt-4o': this daemon serves 'stories260K'")
        code, body = curl("http://x/health")
        self.assertEqual((code, json.loads(body)), (200, {"status": "ok"}))

    def test_completion_matches_protocol(self):
        code, body = curl("http://x/v1/completions",
                          data={"model": "stories260K", "prompt": PROMPT, "max_tokens": 24,
                                "temperature": 0})
        self.assertEqual(code, 200, body)
        r = json.loads(body)
        self.assertEqual(r["object"], "text_completion")
        text, res = own_generate(PROMPT, max_tokens=24, temperature=0, top_k=0, top_p=1.0)
        self.assertEqual(r["choices"][0]["text"], text)
        self.assertEqual(r["choices"][0]["finish_reason"], "length")
        u = r["usage"]
        self.assertEqual(u["prompt_tokens"], res["usage"]["prompt_tokens"])
        self.assertEqual(u["completion_tokens"], res["usage"]["completion_tokens"])
        self.assertEqual(u["completion_tokens"], 24)
        with sinkd.Client(socket=D.sock) as c:
            self.assertEqual(u["prompt_tokens"], len(c.tokenize(PROMPT)))
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + 24)

    def test_stream_equals_whole(self):
        req = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
        _, body = curl("http://x/v1/completions", data=req)
        whole = json.loads(body)
        code, body = curl("-N", "http://x/v1/completions",
                          data=dict(req, stream=True, stream_options={"include_usage": True}))
        self.assertEqual(code, 200)
        ev = sse(body)
        self.assertEqual(ev[-1], "[DONE]")
        chunks = [json.loads(e) for e in ev[:-1]]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        self.assertEqual(text, whole["choices"][0]["text"])
        self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], "length")
        self.assertEqual(chunks[-1]["usage"], whole["usage"])
        self.assertEqual(sum(1 for c in chunks if c["choices"] and c["choices"][0]["text"]), 12)

    def test_seed_and_sampling(self):
        req = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "seed": 7}
        a = json.loads(curl("http://x/v1/completions", data=req)[1])
        b = json.loads(curl("http://x/v1/completions", data=req)[1])
        self.assertEqual(a["choices"][0]["text"], b["choices"][0]["text"])
        text, _ = own_generate(PROMPT, max_tokens=16, temperature=1.0, top_p=0.9, top_k=0, seed=7)
        self.assertEqual(a["choices"][0]["text"], text)
        # top_p 0 (OpenAI's range is 0 to 1): the most likely token only.
        req = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "top_p": 0, "seed": 7}
        code, body = curl("http://x/v1/completions", data=req)
        self.assertEqual(code, 200, body)
        text, _ = own_generate(PROMPT, max_tokens=16, temperature=0)
        self.assertEqual(json.loads(body)["choices"][0]["text"], text)

    def test_stop_string_excluded(self):
        full = json.loads(curl("http://x/v1/completions",
                               data={"prompt": PROMPT, "max_tokens": 24, "temperature": 0})[1])
        t = full["choices"][0]["text"]
        stop = t[10:14]
        idx = t.index(stop)
        for stream in (False, True):
            code, body = curl("-N", "http://x/v1/completions",
                              data={"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                    "stop": [stop, "zzzz"], "stream": stream})
            self.assertEqual(code, 200)
            if stream:
                chunks = [json.loads(e) for e in sse(body)[:-1]]
                got = "".join(c["choices"][0]["text"] for c in chunks)
                reason = chunks[-1]["choices"][0]["finish_reason"]
            else:
                r = json.loads(body)
                got, reason = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
            self.assertEqual(got, t[:idx])
            self.assertEqual(reason, "stop")

    def test_sessions(self):
        code, body = curl("http://x/v1/completions",
                          data={"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                "session": "new", "policy": "window", "window": 16})
        self.assertEqual(code, 200, body)
        r = json.loads(body)
        ext = r["sinkd"]
        sid = ext["session"]
        n_prompt = r["usage"]["prompt_tokens"]
        with sinkd.Client(socket=D.sock) as c:
            st = c.stats(sid)
        self.assertEqual(st["policy"], "window")
        self.assertEqual((ext["seen"], ext["resident"]), (st["seen"], st["resident"]))
        self.assertEqual(ext["evicted"], max(0, st["seen"] - 16))
        # Continued: only the new text is appended; the window evicts.
        code, body = curl("http://x/v1/completions",
                          data={"prompt": " and", "max_tokens": 8, "temperature": 0,
                                "session": sid})
        r2 = json.loads(body)
        self.assertEqual(code, 200, body)
        self.assertEqual(r2["sinkd"]["session"], sid)
        self.assertEqual(r2["sinkd"]["resident"], 16)
        self.assertGreater(r2["sinkd"]["seen"], ext["seen"])
        self.assertTrue(r2["sinkd"]["evicted_ranges"])
        with sinkd.Client(socket=D.sock) as c:
            self.assertEqual(r2["usage"]["prompt_tokens"], len(c.tokenize(" and", bos=False)))
        self.assertGreaterEqual(n_prompt, 5)
        # Unknown session: 404; other policy fields with an id: 400.
        code, body = curl("http://x/v1/completions", data={"prompt": "x", "session": 999999})
        self.assertEqual(code, 404)
        self.assertEqual(json.loads(body)["error"]["code"], "no_such_session")
        with sinkd.Client(socket=D.sock) as c:
            c.close_session(sid)

    def test_metrics(self):
        curl("http://x/v1/completions", data={"prompt": PROMPT, "max_tokens": 3})
        code, body = curl("http://x/metrics")
        self.assertEqual(code, 200)
        m = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                m[k] = float(v)
        self.assertGreaterEqual(m['sinkd_http_requests_total{route="completions"}'], 1)
        self.assertGreaterEqual(m["sinkd_tokens_generated_total"], 3)
        self.assertGreater(m["sinkd_http_token_interval_seconds_count"], 0)
        with sinkd.Client(socket=D.sock) as c:
            st = c.stats()
        self.assertGreaterEqual(st["tokens_generated"], m["sinkd_tokens_generated_total"])

    def test_metrics_speculation(self):
        # a greedy look-up completion of text that repeats: proposals kept
        # and refused, reported in its usage and in the totals of /metrics
        # and the daemon's stats alike
        code, body = curl("http://x/v1/completions",
                          data={"prompt": "one two three four " * 12, "max_tokens": 32,
                                "temperature": 0, "speculation": "lookup", "draft_tokens": 4,
                                "draft_fixed": True})
        self.assertEqual(code, 200, body)
        det = json.loads(body)["usage"]["completion_tokens_details"]
        self.assertGreater(det["accepted_prediction_tokens"], 0)
        code, body = curl("http://x/metrics")
        self.assertEqual(code, 200)
        m = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                m[k] = float(v)
        with sinkd.Client(socket=D.sock) as c:
            sp = c.stats()["speculation"]
        self.assertGreaterEqual(sp["accepted"], det["accepted_prediction_tokens"])
        self.assertEqual(m["sinkd_spec_drafted_tokens_total"], sp["drafted"])
        self.assertEqual(m["sinkd_spec_accepted_tokens_total"], sp["accepted"])
        self.assertEqual(m["sinkd_spec_rejected_tokens_total"], sp["drafted"] - sp["accepted"])
        self.assertAlmostEqual(m["sinkd_spec_acceptance_ratio"],
                               sp["accepted"] / sp["drafted"], places=4)


def own_chat(messages, **kw):
    """The same chat through the msgpack protocol's chat op."""
    with sinkd.Client(socket=D.sock) as c:
        s = c.open(temporary=True)
        res = {}
        text = "".join(c.chat(s, messages, result=res, **kw))
        return text, res


class Chat(unittest.TestCase):
    def chat(self, **req):
        code, body = curl("-N", "http://x/v1/chat/completions", data=req)
        self.assertEqual(code, 200, body)
        return body

    def test_chat_matches_protocol(self):
        r = json.loads(self.chat(messages=STORY, max_tokens=12, temperature=0))
        self.assertEqual(r["object"], "chat.completion")
        msg = r["choices"][0]["message"]
        self.assertEqual(msg["role"], "assistant")
        text, res = own_chat(STORY, max_tokens=12, temperature=0, top_k=0, top_p=1.0)
        self.assertEqual(msg["content"], text)
        self.assertEqual(r["usage"]["prompt_tokens"], res["usage"]["prompt_tokens"])
        self.assertEqual(r["usage"]["completion_tokens"], res["usage"]["completion_tokens"])
        self.assertEqual(r["choices"][0]["finish_reason"],
                         "length" if res["stop"] == "length" else "stop")

    def test_content_parts(self):
        # OpenAI's content as an array of text parts: the same as the
        # joined string.
        parts = [{"role": "user", "content": [{"type": "text", "text": "Tell me "},
                                              {"type": "text", "text": "a story."}]}]
        a = json.loads(self.chat(messages=parts, max_tokens=12, temperature=0))
        text, res = own_chat(STORY, max_tokens=12, temperature=0, top_k=0, top_p=1.0)
        self.assertEqual(a["choices"][0]["message"]["content"], text)
        self.assertEqual(a["usage"]["prompt_tokens"], res["usage"]["prompt_tokens"])
        image = [{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                              {"type": "image_url", "image_url": {"url": "x"}}]}]
        code, body = curl("http://x/v1/chat/completions", data={"messages": image})
        self.assertEqual(code, 400)
        self.assertEqual(json.loads(body)["error"]["message"],
                         "'messages[0].content[1]' must be {\"type\": \"text\", \"text\": "
                         "STRING}: sinkd takes text only")

    def test_chat_stream(self):
        whole = json.loads(self.chat(messages=STORY, max_tokens=10, temperature=0))
        ev = sse(self.chat(messages=STORY, max_tokens=10, temperature=0, stream=True,
                           stream_options={"include_usage": True}))
        self.assertEqual(ev[-1], "[DONE]")
        chunks = [json.loads(e) for e in ev[:-1]]
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertNotIn("sinkd", chunks[0])  # only for "session": "new"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks
                       if c["choices"])
        self.assertEqual(text, whole["choices"][0]["message"]["content"])
        self.assertEqual(chunks[-1]["usage"], whole["usage"])

    def test_session_appends_only_new_messages(self):
        # Two sessions with the same first turn; the next turn is sent
        # once as the whole conversation (as OpenAI clients do), once as
        # only the new message: the same tokens go in, the same reply
        # comes out.
        first = []
        for _ in range(2):
            r = json.loads(self.chat(messages=STORY, max_tokens=6, temperature=0,
                                     session="new", policy="dense", capacity=512))
            first.append(r)
        self.assertEqual(first[0]["choices"][0]["message"], first[1]["choices"][0]["message"])
        a, b = first[0]["sinkd"]["session"], first[1]["sinkd"]["session"]
        self.assertNotEqual(a, b)
        reply = first[0]["choices"][0]["message"]
        more = {"role": "user", "content": "And then?"}
        full = json.loads(self.chat(messages=STORY + [reply, more], max_tokens=6,
                                    temperature=0, session=a))
        delta = json.loads(self.chat(messages=[more], max_tokens=6, temperature=0, session=b))
        self.assertEqual(full["choices"][0]["message"], delta["choices"][0]["message"])
        self.assertEqual(full["usage"], delta["usage"])
        self.assertEqual(full["sinkd"]["seen"], delta["sinkd"]["seen"])
        self.assertGreater(full["sinkd"]["seen"], first[0]["sinkd"]["seen"])
        with sinkd.Client(socket=D.sock) as c:
            self.assertEqual(c.stats(a)["seen"], full["sinkd"]["seen"])
            c.close_session(a)
            c.close_session(b)


# Run as another uid: n chats, each on a new session ("session": "new")
# then closed (the protocol's close), on one keep-alive connection:
# as many conversations as the gateway remembers, and more.
AS_USER_CHATS = r"""
import json, socket, sys, sinkd
http, sock, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_UNIX)
s.connect(http)
s.settimeout(60)
c = sinkd.Client(socket=sock, timeout=60)
buf = b""
for i in range(n):
    body = json.dumps({"messages": [{"role": "user", "content": "Hi %d" % i}], "max_tokens": 1,
                       "temperature": 0, "session": "new", "policy": "window", "window": 32})
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, buf = buf.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(buf) < length:
        buf += s.recv(65536)
    r, buf = json.loads(buf[:length]), buf[length:]
    c.close_session(r["sinkd"]["session"])
print("done %d" % n, flush=True)
"""


class Conversations(unittest.TestCase):
    def test_one_uid_does_not_evict_another(self):
        # Root's two sessions with the same first turn; then nobody goes
        # through more conversations than the gateway remembers; root's
        # next turn, sent as the whole conversation, still appends only
        # the new message (the same as sending it alone).
        first = []
        for _ in range(2):
            code, body = curl("http://x/v1/chat/completions",
                              data={"messages": STORY, "max_tokens": 6, "temperature": 0,
                                    "session": "new", "policy": "dense", "capacity": 512})
            self.assertEqual(code, 200, body)
            first.append(json.loads(body))
        a, b = first[0]["sinkd"]["session"], first[1]["sinkd"]["session"]
        open_to_all(D)
        env_dir = os.path.dirname(os.path.dirname(sinkd.__file__))
        p = subprocess.run([sys.executable, "-c", AS_USER_CHATS, D.http, D.sock, "1100"],
                           user=65534, group=65534, extra_groups=[], capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, PYTHONPATH=env_dir))
        self.assertEqual(p.stdout.strip(), "done 1100", p.stderr)
        reply = first[0]["choices"][0]["message"]
        more = {"role": "user", "content": "And then?"}
        _, body = curl("http://x/v1/chat/completions",
                       data={"messages": STORY + [reply, more], "max_tokens": 6,
                             "temperature": 0, "session": a})
        full = json.loads(body)
        _, body = curl("http://x/v1/chat/completions",
                       data={"messages": [more], "max_tokens": 6, "temperature": 0,
                             "session": b})
        delta = json.loads(body)
        self.assertEqual(full["usage"], delta["usage"])
        self.assertEqual(full["sinkd"]["seen"], delta["sinkd"]["seen"])
        with sinkd.Client(socket=D.sock) as c:
            c.close_session(a)
            c.close_session(b)


class SystemPrompt(unittest.TestCase):
    """What every OpenAI client sends: a system message, with the
    daemon's default settings, on a model with a chat template (Qwen2's
    vocabulary and ChatML, random weights): 200 OK, the prompt pinned as
    the sinks, for 11 tokens and for 205."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sinkd-qwen2-")
        cls.model = os.path.join(cls.tmp, "qwen2-vocab.gguf")
        subprocess.run([os.environ["SK_MKMODEL"], "-s", "260K", "-t", "q8_0", "--vocab-from",
                        os.environ["SK_QWEN2_VOCAB"], "-o", cls.model], check=True,
                       capture_output=True)
        cls.d = Daemon(model=cls.model, defaults=True)

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert rc == 0, "sinkd exited %d" % rc

    def post(self, body):
        cmd = ["curl", "-sS", "--max-time", "60", "--unix-socket", self.d.http,
               "-H", "Content-Type: application/json", "--data-binary", json.dumps(body),
               "-w", "\n%{http_code}", "http://x/v1/chat/completions"]
        out = subprocess.run(cmd, capture_output=True, check=True)
        body, _, code = out.stdout.rpartition(b"\n")
        return int(code), body

    def test_system_message(self):
        with sinkd.Client(socket=self.d.sock) as c:
            cap = c.open_info(temporary=True)["capacity"]
            sys11 = "You are a helpful assistant."
            framed = c.call("tokenize", text="<|im_start|>system\n%s<|im_end|>\n" % sys11,
                            parse_special=True)["tokens"]
            self.assertEqual(len(framed), 11)
            sys200 = " ".join(["cat"] * 200)
            self.assertEqual(len(c.tokenize(sys200)), 200)
        for sys_text, n_pin in ((sys11, 11), (sys200, 205)):
            msgs = [{"role": "system", "content": sys_text}, {"role": "user", "content": "Hi"}]
            for stream in (False, True):
                code, body = self.post({"messages": msgs, "max_tokens": 4, "stream": stream})
                self.assertEqual(code, 200, body)
            code, body = self.post({"messages": msgs, "max_tokens": 4, "session": "new"})
            self.assertEqual(code, 200, body)
            sid = json.loads(body)["sinkd"]["session"]
            with sinkd.Client(socket=self.d.sock) as c:
                st = c.stats(sid)
                c.close_session(sid)
            self.assertEqual(st["pinned"], n_pin)
            self.assertEqual(st["n_sink"], n_pin)
            self.assertEqual(st["window"], cap - n_pin)
        # Too long for the budget: 400 naming both numbers and the option.
        n = cap - cap // 4 - 4
        code, body = self.post({"messages": [{"role": "system", "content": " ".join(["cat"] * n)},
                                             {"role": "user", "content": "Hi"}]})
        self.assertEqual(code, 400, body)
        self.assertEqual(json.loads(body)["error"]["message"],
                         "the system prompt is %d tokens: pinned as the session's sinks it "
                         "leaves %d of the session's budget of %d tokens to the window, less "
                         "than a quarter (%d): open the session with a larger 'window' (the "
                         "daemon's default: sinkd --window)"
                         % (n + 5, cap - n - 5, cap, (cap + 3) // 4))
        # A system message after another: the order is what is wrong.
        code, body = self.post({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "system", "content": "Be brief."}]})
        self.assertEqual(code, 400, body)
        self.assertEqual(json.loads(body)["error"]["message"],
                         "messages[1]: a system message goes first: put it before the others")


class Tcp(unittest.TestCase):
    def get(self, path, auth=None):
        cmd = ["curl", "-sS", "--max-time", "30", "-w", "\n%{http_code}"]
        if auth:
            cmd += ["-H", "Authorization: " + auth]
        out = subprocess.run(cmd + ["http://127.0.0.1:%d%s" % (D.port, path)],
                             capture_output=True, check=True).stdout
        body, _, code = out.rpartition(b"\n")
        return int(code), body

    def test_key(self):
        self.assertEqual(self.get("/health")[0], 401)
        self.assertEqual(self.get("/health", "Bearer wrong-key-wrong-key")[0], 401)
        self.assertEqual(self.get("/health", "Bearer " + KEY[:-1])[0], 401)
        code, body = self.get("/v1/models", "Bearer " + KEY)
        self.assertEqual(code, 200, body)

    def test_key_file_mode(self):
        d = tempfile.mkdtemp()
        key = os.path.join(d, "key")
        with open(key, "w") as f:
            f.write(KEY)
        os.chmod(key, 0o644)
        p = subprocess.run([SINKD, "--model", MODEL, "--socket", os.path.join(d, "s.sock"),
                            "--state-dir", os.path.join(d, "state"), "--http-listen",
                            "127.0.0.1:%d" % free_port(), "--http-key-file", key],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("must be a regular file of mode 0600", p.stderr + p.stdout)
        p = subprocess.run([SINKD, "--model", MODEL, "--http-listen", "10.1.2.3:80x"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("is not ADDRESS:PORT", p.stderr)
        p = subprocess.run([SINKD, "--model", MODEL, "--socket", os.path.join(d, "t.sock"),
                            "--state-dir", os.path.join(d, "state"),
                            "--http-listen", "127.0.0.1:8080"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("a TCP listener needs an API key", p.stderr + p.stdout)
        shutil.rmtree(d)


class Activation(unittest.TestCase):
    def test_passed_sockets(self):
        """systemd-socket-activate passes both sockets, the HTTP one named
        "http" (as sinkd-http.socket does): sinkd serves on both and binds
        nothing of its own."""
        act = shutil.which("systemd-socket-activate")
        self.assertIsNotNone(act, "systemd-socket-activate (Debian package systemd)")
        d = tempfile.mkdtemp()
        a, h = os.path.join(d, "a.sock"), os.path.join(d, "h.sock")
        p = subprocess.Popen([act, "-l", a, "-l", h, "--fdname=sinkd:http", SINKD, "--model",
                              MODEL, "--state-dir", os.path.join(d, "state"), "--socket",
                              os.path.join(d, "unused.sock")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 10
            while not (os.path.exists(a) and os.path.exists(h)) and time.time() < deadline:
                time.sleep(0.05)
            resp = raw(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", path=h)
            self.assertEqual(status_of(resp), 200, resp)
            with sinkd.Client(socket=a, timeout=10) as c:
                c.ping()
            self.assertFalse(os.path.exists(os.path.join(d, "unused.sock")))
            self.assertFalse(os.path.exists(os.path.join(d, "sinkd-http.sock")))
        finally:
            p.terminate()
            _, err = p.communicate(timeout=30)
            shutil.rmtree(d)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("HTTP (OpenAI-compatible) on the passed socket", err)



class OpenAISDK(unittest.TestCase):
    def test_sdk(self):
        npm_dir = os.environ["SK_NPM_DIR"]
        os.makedirs(npm_dir, exist_ok=True)
        if not os.path.exists(os.path.join(npm_dir, "node_modules", "openai")):
            p = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", npm_dir,
                                "openai@4"], capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, "npm install openai failed:\n" + p.stderr)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test-http-sdk.mjs")
        env = dict(os.environ, SK_BASE_URL="http://127.0.0.1:%d/v1" % D.port, SK_KEY=KEY,
                   SK_NPM_DIR=npm_dir, SK_CHAT="1")
        p = subprocess.run(["node", script], capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        out = json.loads(p.stdout.strip().splitlines()[-1])
        text, res = own_generate(PROMPT, max_tokens=20, temperature=0, top_k=0, top_p=1.0)
        self.assertEqual(out["completion"]["text"], text)
        self.assertEqual(out["completion"]["usage"]["completion_tokens"],
                         res["usage"]["completion_tokens"])
        self.assertEqual(out["completion"]["usage"]["prompt_tokens"],
                         res["usage"]["prompt_tokens"])
        self.assertEqual(out["stream"]["text"], text[:len(out["stream"]["text"])])
        self.assertEqual(out["stream"]["usage"]["completion_tokens"], 20)
        self.assertEqual(out["stream"]["finish_reason"], "length")
        ctext, cres = own_chat(STORY, max_tokens=16, temperature=0, top_k=0, top_p=1.0)
        self.assertEqual(out["chat"]["text"], ctext)
        self.assertEqual(out["chat"]["usage"]["prompt_tokens"], cres["usage"]["prompt_tokens"])
        self.assertEqual(out["chat"]["usage"]["completion_tokens"],
                         cres["usage"]["completion_tokens"])
        self.check_sdk_system(out)
        self.check_sdk_logprobs(out)
        self.assertEqual(out["tools"]["status"], 400)
        self.assertIn("'tools': sinkd has no tool calls: only []", out["tools"]["message"])

    def check_sdk_system(self, out):
        # A system message (streamed or not) and the developer role: the
        # protocol's chat op with the same messages, the prompt pinned.
        sys_msgs = [{"role": "system", "content": "You are a helpful assistant."}] + STORY
        with sinkd.Client(socket=D.sock) as c:
            s = c.open(temporary=True)
            res = {}
            text = "".join(c.chat(s, sys_msgs, result=res, max_tokens=12, temperature=0,
                                  top_k=0, top_p=1.0))
            st = c.stats(s)
        self.assertGreater(st["pinned"], 4)
        self.assertEqual(st["n_sink"], st["pinned"])
        self.assertEqual(st["window"], 256 - st["pinned"])  # --window 252 + 4 sinks
        for key in ("system", "system_stream", "developer"):
            self.assertEqual(out[key]["text"], text, key)
            self.assertEqual(out[key]["usage"]["prompt_tokens"], res["usage"]["prompt_tokens"])
            self.assertEqual(out[key]["usage"]["completion_tokens"],
                             res["usage"]["completion_tokens"])
        # The conversation on a persistent session: the protocol's chat op
        # with the first turn, then only the new message.
        with sinkd.Client(socket=D.sock) as c:
            s = c.open(temporary=True)
            t1 = "".join(c.chat(s, sys_msgs, max_tokens=8, temperature=0, top_k=0, top_p=1.0))
            res = {}
            t2 = "".join(c.chat(s, [{"role": "user", "content": "And then?"}], result=res,
                                max_tokens=8, temperature=0, top_k=0, top_p=1.0))
            st = c.stats(out["multi"]["session"])
            c.close_session(out["multi"]["session"])
        self.assertEqual(out["multi"]["turn1"], t1)
        self.assertEqual(out["multi"]["turn2"], t2)
        self.assertEqual(out["multi"]["usage2"]["prompt_tokens"], res["usage"]["prompt_tokens"])
        self.assertEqual(out["multi"]["seen2"], res["seen"])
        self.assertEqual(st["n_sink"], st["pinned"])
        self.assertGreater(st["pinned"], 4)

    def check_sdk_logprobs(self, out):
        # Chat: sinkd's own log-probabilities are the protocol chat op's
        # token events (logprob, bytes, top_logprobs); the SDK's are the
        # same numbers, streamed or not.
        events = []
        with sinkd.Client(socket=D.sock) as c:
            s = c.open(temporary=True)
            text = "".join(c.chat(s, STORY, events=events, max_tokens=8, temperature=0,
                                  top_k=0, top_p=1.0, logprobs=True, top_logprobs=3))
        lp = out["chat_logprobs"]["logprobs"]
        self.assertEqual(out["chat_logprobs"]["text"], text)
        self.assertIsNone(lp["refusal"])
        self.assertEqual(len(lp["content"]), len(events))
        for got, ev in zip(lp["content"], events):
            self.assertEqual(got["bytes"], list(ev["bytes"]))
            self.assertEqual(got["token"], ev["bytes"].decode(errors="replace"))
            self.assertEqual(got["logprob"], ev["logprob"])
            self.assertEqual(len(got["top_logprobs"]), 3)
            for g, t in zip(got["top_logprobs"], ev["top_logprobs"]):
                self.assertEqual(g["bytes"], list(t[2]))
                self.assertEqual(g["logprob"], t[1])
            # greedy: the most likely token is the one chosen
            self.assertEqual(got["top_logprobs"][0]["logprob"], got["logprob"])
        self.assertEqual("".join(e["token"] for e in lp["content"]), text)
        self.assertEqual(out["chat_logprobs_stream"], lp["content"])
        # Completions: the tokens' log-probabilities are those append with
        # logprobs gives the prompt and the generated tokens, fed to a new
        # session (teacher-forced).
        cl = out["completion_logprobs"]
        with sinkd.Client(socket=D.sock) as c:
            s = c.open(temporary=True)
            text, res = "", {}
            events = []
            text = "".join(c.generate(s, prompt=PROMPT, max_tokens=8, temperature=0, top_k=0,
                                      top_p=1.0, result=res, events=events))
            ids = c.tokenize(PROMPT) + [e["token"] for e in events]
            s2 = c.open(temporary=True)
            want = c.append(s2, tokens=ids, logprobs=True)["logprobs"][-len(events):]
        self.assertEqual(cl["text"], text)
        l = cl["logprobs"]
        self.assertEqual("".join(l["tokens"]), text)
        self.assertEqual(len(l["token_logprobs"]), len(want))
        for got, w in zip(l["token_logprobs"], want):
            self.assertAlmostEqual(got, w, delta=1e-5)
        offset = 0
        for tok, off, top, lpv in zip(l["tokens"], l["text_offset"], l["top_logprobs"],
                                      l["token_logprobs"]):
            self.assertEqual(off, offset)
            offset += len(tok)
            self.assertIn(tok, top)  # the chosen token with the 2 likeliest
            self.assertEqual(top[tok], lpv)
            self.assertLessEqual(len(top), 3)
        self.assertEqual(out["completion_logprobs_stream"], l)


if __name__ == "__main__":
    unittest.main(verbosity=2)
