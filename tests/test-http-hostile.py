#!/usr/bin/python3
"""The HTTP endpoint against a live daemon (httpfixture.py): the hostile
table on raw sockets, a disconnect in the middle of a stream, a bounded
load while another client pings, and the limits on clients, sessions and
what a request may hold.

Environment (from meson): SK_SINKD, SK_MODEL, SK_PYTHON_DIR, SK_MAN_DIR.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # nothing written into the checkout
import httpfixture  # noqa: E402
import sinkd  # noqa: E402
from httpfixture import (KEY, MODEL, PROMPT, SINKD, STORY, Daemon, as_user, curl, free_port,
                         open_to_all, own_generate, raw, status_of, tearDownModule)  # noqa: E402


def setUpModule():
    global D
    httpfixture.setUpModule()
    D = httpfixture.D

def body_of(resp):
    return resp.split(b"\r\n\r\n", 1)[1]


POST = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s")


def post(body, extra=b"", route="completions"):
    req = POST.replace(b"Host: x\r\n", b"Host: x\r\n" + extra) % (len(body), body)
    return req.replace(b"/v1/completions", b"/v1/chat/completions") if route == "chat" else req


class Hostile(unittest.TestCase):
    def still_fine(self):
        with sinkd.Client(socket=D.sock, timeout=5) as c:
            t = time.time()
            c.ping()
            self.assertLess(time.time() - t, 0.5)
        code, _ = curl("http://x/health")
        self.assertEqual(code, 200)

    def expect(self, data, status, code=None, closed=True, chunks=None):
        resp = raw(data, chunks=chunks)
        self.assertEqual(status_of(resp), status, resp[:300])
        if closed:
            self.assertFalse(resp.endswith(b"<timeout>"), "connection not closed")
        if resp.endswith(b"<reset>"):  # closed with the client's bytes unread
            resp = resp[:-7]
        if code:
            err = json.loads(body_of(resp))
            self.assertEqual(err["error"]["code"], code, err)
            self.assertIsInstance(err["error"]["message"], str)
        self.still_fine()
        return resp

    def test_table(self):
        big = b"a" * (2 << 20)
        cases = [
            ("oversized headers", b"GET /health HTTP/1.1\r\nX-A: " + b"a" * 20000 + b"\r\n\r\n",
             431, "malformed_request"),
            ("too many headers", b"GET /health HTTP/1.1\r\n" + b"X-A: 1\r\n" * 100 + b"\r\n", 431,
             "malformed_request"),
            ("long target", b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414, "malformed_request"),
            ("declared body too large",
             b"POST /v1/completions HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", 413,
             "malformed_request"),
            ("body too large", post(big), 413, "malformed_request"),
            ("chunked body too large",
             b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" +
             (b"100000\r\n" + b"a" * 0x100000 + b"\r\n") * 2 + b"0\r\n\r\n", 413,
             "malformed_request"),
            ("bad chunk size",
             b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
             400, "malformed_request"),
            ("garbage", b"\x00\x01\x02\xff garbage\r\n\r\n", 400, "malformed_request"),
            ("bad version", b"GET /health HTTP/9.Q\r\n\r\n", 400, "malformed_request"),
            ("upgrade", b"GET /health HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
             400, "malformed_request"),
            ("compressed body", post(b"\x1f\x8b\x08\x00", b"Content-Encoding: gzip\r\n"), 415,
             "malformed_request"),
        ]
        for name, data, status, code in cases:
            with self.subTest(name):
                self.expect(data, status, code)

    def test_bad_json(self):
        close = b"Connection: close\r\n"
        cases = [
            ("invalid JSON", b"{\"prompt\": ", "invalid JSON"),
            ("not an object", b"[1,2]", "must be a JSON object"),
            ("duplicate key", b'{"prompt":"a","prompt":"b"}', "invalid JSON"),
            ("prompt type", b'{"prompt": 5}', "'prompt' must be a string"),
            ("max_tokens type", b'{"prompt": "a", "max_tokens": "x"}', "'max_tokens' must be"),
            ("negative max_tokens", b'{"prompt": "a", "max_tokens": -1}', "'max_tokens' must be"),
            ("huge max_tokens", b'{"prompt": "a", "max_tokens": 1000000000000}',
             "'max_tokens' must be an integer from 0 to 1048576"),
            ("temperature range", b'{"prompt": "a", "temperature": 5}', "'temperature' must be"),
            ("top_p type", b'{"prompt": "a", "top_p": "high"}', "'top_p' must be"),
            ("stream type", b'{"prompt": "a", "stream": "yes"}', "'stream' must be true or false"),
            ("n = 2", b'{"prompt": "a", "n": 2}', "'n' must be 1"),
            ("stop type", b'{"prompt": "a", "stop": [1]}', "'stop' must be"),
            ("too many stops", b'{"prompt": "a", "stop": [' + b",".join([b'"x"'] * 17) + b"]}",
             "at most 16"),
            ("session type", b'{"prompt": "a", "session": "old"}', "'session' must be"),
            ("bad policy", b'{"prompt": "a", "policy": "lru"}', "policy"),
            ("empty body", b"", "invalid JSON"),
            ("NUL in a string", b'{"prompt": "a\\u0000b"}',
             "invalid JSON at byte 21: a string holds \\u0000 (NUL)"),
            # the allow-list (sinkd-http(7)): a field named, or its value
            ("unknown field", b'{"prompt": "a", "frobnicate": null}',
             "'frobnicate' is not a field sinkd takes on /v1/completions"),
            ("chat field on completions", b'{"prompt": "a", "messages": []}',
             "'messages' is not a field sinkd takes on /v1/completions"),
            ("penalty", b'{"prompt": "a", "presence_penalty": 0.5}',
             "'presence_penalty': sinkd has no penalties: only 0"),
            ("logit_bias", b'{"prompt": "a", "logit_bias": {"1": 5}}',
             "'logit_bias': sinkd has no logit bias"),
            ("echo", b'{"prompt": "a", "echo": true}', "'echo': the prompt is not echoed"),
            ("best_of", b'{"prompt": "a", "best_of": 3}', "'best_of': only 1"),
            ("logprobs range", b'{"prompt": "a", "logprobs": 21}',
             "'logprobs' must be an integer from 0 to 20"),
            ("draft_tokens 0", b'{"prompt": "a", "draft_tokens": 0}',
             "'draft_tokens' must be an integer from 1 to 15"),
            ("draft_tokens 16", b'{"prompt": "a", "draft_tokens": 16}',
             "'draft_tokens' must be an integer from 1 to 15"),
            ("stream_options without stream",
             b'{"prompt": "a", "stream_options": {"include_usage": true}}',
             "'stream_options' goes with \"stream\": true"),
            ("stream_options field",
             b'{"prompt": "a", "stream": true, "stream_options": {"x": 1}}',
             "'stream_options.x' is not a field sinkd takes"),
        ]
        for name, body, needle in cases:
            with self.subTest(name):
                resp = self.expect(post(body, close), 400)
                err = json.loads(body_of(resp))["error"]
                self.assertIn(needle, err["message"])
                self.assertEqual(err["type"], "invalid_request_error")

    def test_chat_fields(self):
        # The chat route's allow-list; the fields that ask for nothing, or
        # that mean nothing here, are taken.
        close = b"Connection: close\r\n"
        msgs = b'"messages": [{"role": "user", "content": "Hi"}]'
        cases = [
            (b'"tools": [{"type": "function"}]', "'tools': sinkd has no tool calls: only []"),
            (b'"tool_choice": "auto"', "'tool_choice': sinkd has no tool calls"),
            (b'"response_format": {"type": "json_object"}',
             "'response_format': sinkd writes text only"),
            (b'"top_logprobs": 2', "'top_logprobs' needs \"logprobs\": true"),
            (b'"logprobs": 1', "'logprobs' must be true or false"),
            (b'"audio": {"voice": "alloy"}',
             "'audio' is not a field sinkd takes on /v1/chat/completions"),
            (b'"prompt": "x"', "'prompt' is not a field sinkd takes on /v1/chat/completions"),
        ]
        for field, needle in cases:
            with self.subTest(field):
                resp = self.expect(post(b"{" + msgs + b", " + field + b"}", close, "chat"), 400)
                self.assertIn(needle, json.loads(body_of(resp))["error"]["message"])
        ok = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
              "user": "u-1", "store": False, "metadata": {"a": "b"}, "presence_penalty": 0,
              "frequency_penalty": 0.0, "logit_bias": {}, "tools": [], "tool_choice": "none",
              "response_format": {"type": "text"}, "parallel_tool_calls": True, "n": 1,
              "seed": 5, "stream_options": None, "modalities": ["text"]}
        code, body = curl("http://x/v1/chat/completions", data=ok)
        self.assertEqual(code, 200, body)

    def test_failed_generate_closes_its_session(self):
        # The daemon refuses the generate (context_full) after the
        # request's open: the session that open made ends with the
        # request, not with the keep-alive connection, which would pile
        # them up to the user's session limit. A "session": "new" one
        # too: its id comes only with a successful reply.
        def ids():
            with sinkd.Client(socket=D.sock) as c:
                return {s["session"] for s in c.list()}
        before = ids()
        s = socket.socket(socket.AF_UNIX)
        s.connect(D.http)
        s.settimeout(15)
        full = {"prompt": PROMPT * 4, "policy": "dense", "capacity": 4}
        for body in [json.dumps(full).encode()] * 3 + [
                json.dumps(dict(full, session="new")).encode()] * 3:
            s.sendall(post(body))
            resp = b""
            while b"}}" not in resp:
                b = s.recv(65536)
                self.assertTrue(b, resp)
                resp += b
            self.assertEqual(status_of(resp), 400, resp)
            self.assertEqual(json.loads(body_of(resp))["error"]["code"], "context_full")
        # A request that works, on the same connection: the daemon reads
        # its open after the closes, and answers it after them.
        s.sendall(post(b'{"prompt": "a", "max_tokens": 1, "session": "new"}'))
        resp = b""
        while not resp.endswith(b"}}"):
            b = s.recv(65536)
            self.assertTrue(b, resp)
            resp += b
        self.assertEqual(status_of(resp), 200, resp)
        sid = json.loads(body_of(resp))["sinkd"]["session"]
        self.assertEqual(ids() - before, {sid})
        s.close()
        with sinkd.Client(socket=D.sock) as c:
            c.close_session(sid)
        self.still_fine()

    def test_routes(self):
        close = b"Connection: close\r\n"
        self.expect(b"GET /nope HTTP/1.1\r\n" + close + b"\r\n", 404, "not_found")
        self.expect(b"GET /v1/completions HTTP/1.1\r\n" + close + b"\r\n", 405,
                    "method_not_allowed")
        self.expect(b"DELETE /v1/models HTTP/1.1\r\n" + close + b"\r\n", 405, "method_not_allowed")

    def test_pipelined(self):
        body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "temperature": 0}).encode()
        data = (b"GET /health HTTP/1.1\r\n\r\n" + post(body) + b"GET /v1/models HTTP/1.1\r\n\r\n"
                + b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
        resp = raw(data)
        self.assertFalse(resp.endswith(b"<timeout>"))
        parts = resp.split(b"HTTP/1.1 ")[1:]
        self.assertEqual([int(p[:3]) for p in parts], [200, 200, 200, 200])
        self.assertIn(b'"text_completion"', parts[1])
        self.assertIn(b'"stories260K"', parts[2])
        # Many tiny pipelined requests in one write: all answered in order.
        n = 2000
        resp = raw(b"GET /health HTTP/1.1\r\n\r\n" * n + b"GET /nope HTTP/1.1\r\n"
                   b"Connection: close\r\n\r\n")
        self.assertEqual(resp.count(b"HTTP/1.1 200 OK"), n)
        self.assertTrue(resp.rstrip(b"}").endswith(b'"code":"not_found"'))
        self.still_fine()

    def test_expect_continue(self):
        body = json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode()
        resp = raw(None, chunks=[post(b"", b"Expect: 100-continue\r\nConnection: close\r\n")
                                 .replace(b"Content-Length: 0", b"Content-Length: %d" % len(body)),
                                 body])
        self.assertTrue(resp.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK"), resp)

    def test_content_encoding(self):
        # identity is no coding at all; any other is refused before the
        # body is read, naming it
        body = json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode()
        resp = raw(post(body, b"Content-Encoding: Identity\r\nConnection: close\r\n"))
        self.assertTrue(resp.startswith(b"HTTP/1.1 200 OK"), resp)
        resp = raw(post(body, b"Content-Encoding: br\r\nConnection: close\r\n"))
        self.assertTrue(resp.startswith(b"HTTP/1.1 415 Unsupported Media Type"), resp)
        err = json.loads(body_of(resp))["error"]
        self.assertEqual(err["message"],
                         "Content-Encoding 'br' is not supported: send the body uncompressed")
        self.still_fine()

    def test_error_bodies_are_valid_json(self):
        # A target with bytes that are not UTF-8, and one whose message is
        # cut in the middle of a character: the body is still JSON, with
        # the message as far as it is valid (U+FFFD for a bad byte).
        resp = self.expect(b"GET /\xc3\xa9\xff HTTP/1.1\r\nConnection: close\r\n\r\n", 404,
                           "not_found")
        self.assertEqual(json.loads(body_of(resp))["error"]["message"], "no route /\u00e9\ufffd")
        long = "/" + "\u00e9" * 1000
        resp = self.expect(b"GET " + long.encode() + b" HTTP/1.1\r\nConnection: close\r\n\r\n",
                           404, "not_found")
        msg = json.loads(body_of(resp))["error"]["message"]
        self.assertTrue(("no route " + long).startswith(msg), msg)
        self.assertGreater(len(msg.encode()), 400)

    def test_half_close_after_a_whole_request(self):
        # A client that shuts down its sending side once its request is
        # sent (curl does so with some options) still gets the response.
        s = socket.socket(socket.AF_UNIX)
        s.connect(D.http)
        s.sendall(post(json.dumps({"prompt": PROMPT, "max_tokens": 8,
                                   "temperature": 0}).encode()))
        s.shutdown(socket.SHUT_WR)
        resp = read_until(s, lambda g: False, timeout=30)
        s.close()
        self.assertEqual(status_of(resp), 200, resp)
        text, _ = own_generate(PROMPT, max_tokens=8, temperature=0)
        self.assertEqual(json.loads(body_of(resp))["choices"][0]["text"], text)
        self.still_fine()

    def test_tiny_top_p(self):
        # 5e-324 is above 0 but rounds to 0 as the sampler's float: OpenAI's
        # top_p takes it as "the most likely token only", as 0.
        req = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "top_p": 5e-324, "seed": 3}
        code, body = curl("http://x/v1/completions", data=req)
        self.assertEqual(code, 200, body)
        text, _ = own_generate(PROMPT, max_tokens=8, temperature=0)
        self.assertEqual(json.loads(body)["choices"][0]["text"], text)
        # The protocol refuses it, naming the value it was given.
        with sinkd.Client(socket=D.sock) as c:
            sid = c.open(temporary=True)
            with self.assertRaises(sinkd.SinkdError) as cm:
                list(c.generate(sid, prompt=PROMPT, max_tokens=2, top_p=5e-324))
        self.assertEqual(cm.exception.code, "bad_request")
        self.assertEqual(str(cm.exception.args[0]),
                         "top_p 4.94066e-324 must be in (0, 1] (as a 32-bit float, which it "
                         "rounds to 0)")

    def test_transfer_codings(self):
        body = json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode()
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        head = (b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nTransfer-Encoding: ")
        resp = raw(head + b"chunked\r\n\r\n" + chunked)
        self.assertEqual(status_of(resp), 200, resp)
        # A coding before chunked (gzip) would leave the body compressed:
        # not read as if it were plain chunked.
        for te in (b"gzip, chunked", b"gzip,chunked", b"chunked, chunked", b"identity"):
            with self.subTest(te):
                resp = self.expect(head + te + b"\r\n\r\n" + chunked, 501, "malformed_request")
                self.assertEqual(json.loads(body_of(resp))["error"]["message"],
                                 "Transfer-Encoding '%s' is not supported: send the body as "
                                 "is or chunked" % te.decode())
        # A value longer than what is kept of it: named as far as it is.
        resp = self.expect(head + b"gzip, deflate, br, zstd, chunked\r\n\r\n" + chunked, 501,
                           "malformed_request")
        self.assertEqual(json.loads(body_of(resp))["error"]["message"],
                         "Transfer-Encoding 'gzip, deflate, br, zstd...' is not supported: send "
                         "the body as is or chunked")

    def test_error_types_match_the_manual(self):
        # sinkd-http(7) lists the "type" of each status; the replies agree.
        man = os.path.join(os.environ["SK_MAN_DIR"], "sinkd-http.7.scd")
        with open(man) as f:
            text = f.read()
        table = text.split("[[ *status*", 1)[1].split("\n\n", 1)[0]
        rows, st = {}, None
        for line in table.splitlines():
            if line.startswith("|  "):
                st = line[3:].strip()
            elif line.startswith(":  ") and st:
                rows[st], st = line[3:].strip(), None

        def want(status):
            return (rows.get(str(status)) or rows.get("other %dxx" % (status // 100))
                    or rows["%dxx" % (status // 100)])
        self.assertEqual(set(rows), {"401", "403", "404", "other 4xx", "5xx"}, rows)
        close = b"Connection: close\r\n"
        cases = [
            (b"GET /nope HTTP/1.1\r\n" + close + b"\r\n", 404),
            (b"DELETE /v1/models HTTP/1.1\r\n" + close + b"\r\n", 405),
            (post(b"{", close), 400),
            (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", 413),
            (post(b'{"prompt": "x", "session": 999999}', close), 404),
            (post(b"{}", b"Transfer-Encoding: gzip, chunked\r\n" + close), 501),
        ]
        for data, status in cases:
            with self.subTest(status=status):
                resp = raw(data)
                self.assertEqual(status_of(resp), status, resp)
                self.assertEqual(json.loads(body_of(resp))["error"]["type"], want(status))
        s = socket.create_connection(("127.0.0.1", D.port))
        s.sendall(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
        resp = read_until(s, lambda g: False)
        s.close()
        self.assertEqual(status_of(resp), 401)
        self.assertEqual(json.loads(body_of(resp))["error"]["type"], want(401))

    def test_slowloris(self):
        # Headers one byte at a time, never finished: 408 after the
        # deadline (10 s), and the daemon serves others meanwhile.
        s = socket.socket(socket.AF_UNIX)
        s.connect(D.http)
        t0 = time.time()
        s.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")
        s.settimeout(0.5)
        got = b""
        while time.time() - t0 < 14:
            try:
                try:
                    s.sendall(b"a")
                except OSError:
                    pass  # closed: what it sent is still to be read
                b = s.recv(4096)
                if not b:
                    break
                got += b
            except socket.timeout:
                self.still_fine()
            except OSError:
                break
        s.close()
        self.assertEqual(status_of(got), 408, got)
        self.assertGreaterEqual(time.time() - t0, 9.5)
        self.assertIn(b'"code":"request_timeout"', got)


def stream_request(body, path=None):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path or D.http)
    s.sendall(post(json.dumps(body).encode()))
    return s


class Cancel(unittest.TestCase):
    def test_disconnect_cancels(self):
        with sinkd.Client(socket=D.sock) as c:
            sid = c.open()
            c.append(sid, PROMPT)
            seen0 = c.stats(sid)["seen"]
            s = stream_request({"prompt": " and", "max_tokens": 100000, "stream": True,
                                "session": sid, "temperature": 1.0})
            got = b""
            while got.count(b"data: ") < 5:
                got += s.recv(4096)
            s.close()
            t0 = time.time()
            while c.stats(sid)["busy"]:
                self.assertLess(time.time() - t0, 1.0, "still generating 1 s after the disconnect")
                time.sleep(0.005)
            stopped_ms = (time.time() - t0) * 1000
            seen = c.stats(sid)["seen"]
            time.sleep(0.3)
            self.assertEqual(c.stats(sid)["seen"], seen)
            # Far less than asked: it stopped. The session keeps what was made.
            self.assertLess(seen - seen0, 5000)
            self.assertGreaterEqual(seen - seen0, 5)
            c.close_session(sid)
        print("disconnect: generation stopped %.1f ms after the client closed, "
              "%d tokens generated" % (stopped_ms, seen - seen0 - 1), file=sys.stderr)

    def test_new_session_id_in_first_chunk(self):
        # A stream that opens a session gives its id in the first chunk:
        # a client that stops reading early still owns a session it knows.
        for path, body in [("/v1/completions", {"prompt": PROMPT}),
                           ("/v1/chat/completions", {"messages": STORY})]:
            with self.subTest(path):
                s = socket.socket(socket.AF_UNIX)
                s.connect(D.http)
                data = json.dumps(dict(body, max_tokens=100000, stream=True, session="new"))
                s.sendall(post(data.encode()).replace(b"/v1/completions", path.encode()))
                got = b""
                while b"\n\n" not in got.split(b"data: ", 1)[-1]:
                    got += s.recv(4096)
                first = json.loads(got.split(b"data: ", 1)[1].split(b"\n\n", 1)[0])
                s.close()
                sid = first["sinkd"]["session"]
                with sinkd.Client(socket=D.sock) as c:
                    self.assertGreater(c.stats(sid)["seen"], 0)
                    c.close_session(sid)


PINGER = """
import os, sys, time, sinkd
c = sinkd.Client(socket=sys.argv[1], timeout=10)
c.ping()
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    t = time.monotonic()
    c.ping()
    print("%.3f" % ((time.monotonic() - t) * 1000), flush=True)
    time.sleep(0.005)
"""


class Load(unittest.TestCase):
    def test_concurrent_streams(self):
        n_http, n_msgpack = 100, 8
        errors = []
        done_tokens = []
        start = threading.Barrier(n_http + n_msgpack + 1)

        def http_client(i):
            try:
                start.wait()
                s = stream_request({"prompt": PROMPT, "max_tokens": 32, "stream": True,
                                    "seed": i, "stream_options": {"include_usage": True}})
                s.settimeout(120)
                got = b""
                while not got.endswith(b"0\r\n\r\n"):
                    b = s.recv(65536)
                    if not b:
                        break
                    got += b
                s.close()
                if b"data: [DONE]" not in got:
                    errors.append("http %d: %r" % (i, got[-200:]))
                else:
                    done_tokens.append(got.count(b'"finish_reason":null'))
            except Exception as e:  # noqa: BLE001
                errors.append("http %d: %s" % (i, e))

        def msgpack_client(i):
            try:
                start.wait()
                with sinkd.Client(socket=D.sock, timeout=120) as c:
                    s = c.open(temporary=True)
                    n = sum(1 for _ in c.generate(s, prompt=PROMPT, max_tokens=32, seed=i))
                    if n < 1:
                        errors.append("msgpack %d: no tokens" % i)
            except Exception as e:  # noqa: BLE001
                errors.append("msgpack %d: %s" % (i, e))

        threads = [threading.Thread(target=http_client, args=(i,)) for i in range(n_http)]
        threads += [threading.Thread(target=msgpack_client, args=(i,)) for i in range(n_msgpack)]
        for t in threads:
            t.start()
        # The pings come from a process of their own, so that the
        # clients' threads (and Python's GIL) do not delay them.
        stop = os.path.join(D.dir, "stop-pinger")
        pinger = subprocess.Popen([sys.executable, "-c", PINGER, D.sock, stop],
                                  stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=os.path.dirname(
                                      os.path.dirname(sinkd.__file__))))
        # The load starts once the pinger is connected, so that its pings
        # cover the whole load however fast the machine serves it.
        self.assertEqual(pinger.stdout.readline(), "ready\n")
        start.wait()
        for t in threads:
            t.join()
        open(stop, "w").close()
        out, _ = pinger.communicate(timeout=30)
        self.assertEqual(pinger.returncode, 0)
        pings = sorted(float(x) for x in out.split())
        self.assertEqual(errors, [])
        self.assertEqual(len(done_tokens), n_http)
        self.assertTrue(all(n == 32 for n in done_tokens), done_tokens)
        self.assertGreaterEqual(len(pings), 5)
        over = sum(1 for p in pings if p > 100.0)
        print("figures: http load: %d HTTP streams + %d msgpack clients, %d pings: median "
              "%.2f ms, max %.2f ms, %d over 100 ms"
              % (n_http, n_msgpack, len(pings), pings[len(pings) // 2], pings[-1], over),
              file=sys.stderr)
        # Every ping answered, the median well under the bound; the worst
        # is a figure (printed): a 2-core machine shared with other work
        # delays any process now and then, as test-load says.
        self.assertLess(pings[len(pings) // 2], 100.0)
        Hostile.still_fine(self)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def read_until(s, pred, timeout=15):
    """Reads from s until pred(data) holds, the peer closes or timeout."""
    s.settimeout(timeout)
    got = b""
    try:
        while not pred(got):
            b = s.recv(65536)
            if not b:
                break
            got += b
    except (socket.timeout, ConnectionResetError):
        pass
    return got


# Run as another uid (subprocess user=): opens N HTTP connections, sends
# "GET /health" on each, prints each status (0: closed without one), then
# tries the msgpack socket once (prints what the daemon sent before
# closing), and keeps everything open until its stdin ends.
AS_USER_CONNS = r"""
import json, socket, sys
http, sock, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
conns, out = [], []
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(http)
    s.settimeout(10)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\n\r\n")
    except OSError:
        pass
    got = b""
    try:
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            b = s.recv(4096)
            if not b:
                break
            got += b
    except OSError:
        pass
    status = int(got[9:12]) if got.startswith(b"HTTP/1.1 ") else 0
    body = got.split(b"\r\n\r\n", 1)[1].decode() if b"\r\n\r\n" in got else ""
    out.append([status, body])
    conns.append(s)
m = socket.socket(socket.AF_UNIX)
m.connect(sock)
m.settimeout(10)
frame = b""
try:
    while True:
        b = m.recv(4096)
        if not b:
            break
        frame += b
except OSError:
    frame += b"<open>"
print(json.dumps({"http": out, "msgpack": frame.decode("latin-1")}), flush=True)
sys.stdin.read()
"""


class Limits(unittest.TestCase):
    """The HTTP front end under the protocol's limits."""

    def test_output_bounded_for_a_client_that_never_reads(self):
        # Pipelined requests from a client that never reads: once 1 MiB
        # of responses waits, the daemon stops reading it (the client's
        # sends block), so its memory stays bounded; everything sent is
        # answered once the client reads.
        s = socket.socket(socket.AF_UNIX)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(D.http)
        s.setblocking(False)
        req = b"GET /health HTTP/1.1\r\n\r\n"
        batch = req * 1000
        before = rss_kib(D.proc.pid)
        sent, blocked_at, peak, sampled = 0, None, before, 0.0
        t0 = time.time()
        while sent < 400000 * len(req) and time.time() - t0 < 30:
            if time.time() - sampled > 0.1:
                peak, sampled = max(peak, rss_kib(D.proc.pid)), time.time()
            try:
                sent += s.send(batch[sent % len(batch):])
                blocked_at = None
            except BlockingIOError:
                if blocked_at is None:
                    blocked_at = time.time()
                elif time.time() - blocked_at > 1.0:
                    break
                time.sleep(0.01)
        peak = max(peak, rss_kib(D.proc.pid))
        n_sent = sent // len(req)
        grew = (peak - before) / 1024
        print("figures: http non-reading client: %d requests sent before the daemon stopped "
              "reading, daemon RSS +%.1f MiB" % (n_sent, grew), file=sys.stderr)
        self.assertIsNotNone(blocked_at, "the daemon kept reading %d requests" % n_sent)
        self.assertLess(grew, 24.0)
        # Once the client reads, everything it sent is answered, in order.
        s.setblocking(True)
        got = []
        reader = threading.Thread(target=lambda: got.append(
            read_until(s, lambda g: g.endswith(b'"code":"not_found"}}'), timeout=60)))
        reader.start()
        s.sendall(req[sent % len(req):] if sent % len(req) else b"")
        s.sendall(b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n")
        reader.join()
        s.close()
        got = got[0]
        self.assertEqual(got.count(b"HTTP/1.1 200 OK"), -(-sent // len(req)))
        Hostile.still_fine(self)

    def test_connections_count_toward_the_limits(self):
        # max_clients 16 (8 kept for root), max_user_clients 4: an HTTP
        # connection counts from its accept, as a protocol one does.
        d = Daemon(["--max-clients", "16", "--max-user-clients", "4"], tcp=False)
        kids = []
        try:
            open_to_all(d)

            def run(uid, n):
                p = as_user(uid, AS_USER_CONNS, d.http, d.sock, n)
                kids.append(p)
                return json.loads(p.stdout.readline())

            a = run(65534, 6)
            self.assertEqual([st for st, _ in a["http"]], [200] * 4 + [429] * 2)
            err = json.loads(a["http"][4][1])["error"]
            self.assertEqual(err["code"], "busy")
            self.assertEqual(err["message"],
                             "uid 65534 already has 4 connections (max_user_clients 4)")
            # The protocol socket: the same count, the same refusal.
            self.assertIn("uid 65534 already has 4 connections (max_user_clients 4)",
                          a["msgpack"])
            b = run(1, 6)
            self.assertEqual([st for st, _ in b["http"]], [200] * 4 + [429] * 2)
            c = run(2, 1)
            self.assertEqual(c["http"][0][0], 429)
            self.assertEqual(json.loads(c["http"][0][1])["error"]["message"],
                             "too many clients: uid 2 would be client 9 of max_clients 16, "
                             "whose last 8 are kept for root")
            # Root's reserve: the administrator still gets in, both ways.
            resp = raw(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", path=d.http)
            self.assertEqual(status_of(resp), 200)
            with sinkd.Client(socket=d.sock, timeout=5) as cl:
                cl.ping()
            # Refusals are logged once per uid, not once per connection.
            log = d.logtext()
            self.assertEqual(log.count("refused a connection of uid 65534"), 1, log)
            self.assertEqual(log.count("refused a connection of uid 1:"), 1, log)
            for p in kids:
                p.stdin.close()
                p.wait(10)
            kids = []
            # Their connections gone, the slots are free again.
            deadline = time.time() + 5
            while True:
                c = run(2, 1)
                kids[-1].stdin.close()
                kids[-1].wait(10)
                if c["http"][0][0] == 200 or time.time() > deadline:
                    break
                time.sleep(0.1)
            self.assertEqual(c["http"][0][0], 200)
        finally:
            for p in kids:
                p.kill()
                p.wait()
            self.assertEqual(d.stop(), 0)

    def test_abandoned_new_sessions_are_closed(self):
        # 16 "session": "new" requests whose clients leave after 50 ms,
        # before the response that would have given them the id: their
        # sessions are closed, so the uid's 17th session opens.
        d = Daemon(sessions=16, tcp=False)
        try:
            body = json.dumps({"prompt": PROMPT, "max_tokens": 100000, "session": "new"})
            for _ in range(16):
                s = socket.socket(socket.AF_UNIX)
                s.connect(d.http)
                s.sendall(post(body.encode()))
                time.sleep(0.05)
                s.close()
            deadline = time.time() + 5
            with sinkd.Client(socket=d.sock, timeout=10) as c:
                while c.list() and time.time() < deadline:
                    time.sleep(0.05)
                left = c.list()
            self.assertEqual(left, [])
            s = socket.socket(socket.AF_UNIX)
            s.connect(d.http)
            s.sendall(post(json.dumps({"prompt": PROMPT, "max_tokens": 2,
                                       "session": "new"}).encode()))
            resp = read_until(s, lambda g: g.endswith(b"}}") or g.endswith(b"]}}"))
            s.close()
            self.assertEqual(status_of(resp), 200, resp)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_tcp_acts_as_an_unprivileged_uid(self):
        # sinkd runs as root here: TCP requests act as nobody (65534), so a
        # root session is as unknown to them as one that does not exist.
        with sinkd.Client(socket=D.sock) as c:
            sid = c.open()
            c.append(sid, PROMPT)
        try:
            out = subprocess.run(
                ["curl", "-sS", "--max-time", "30", "-w", "\n%{http_code}", "-H",
                 "Authorization: Bearer " + KEY, "-H", "Content-Type: application/json",
                 "--data-binary", json.dumps({"prompt": " x", "max_tokens": 1, "session": sid}),
                 "http://127.0.0.1:%d/v1/completions" % D.port],
                capture_output=True, check=True).stdout
            body, _, code = out.rpartition(b"\n")
            self.assertEqual(int(code), 404, body)
            self.assertEqual(json.loads(body)["error"],
                             {"message": "no session %d" % sid, "type": "not_found_error",
                              "param": None, "code": "no_such_session"})
        finally:
            with sinkd.Client(socket=D.sock) as c:
                c.close_session(sid)
        self.assertIn("HTTP on 127.0.0.1:%d (TCP, API key): requests act as uid 65534"
                      % D.port, D.logtext())

    def test_public_address_needs_an_option(self):
        d = tempfile.mkdtemp()
        try:
            key = os.path.join(d, "key")
            with open(key, "w") as f:
                f.write(KEY)
            os.chmod(key, 0o600)
            port = free_port()
            p = subprocess.run([SINKD, "--model", MODEL, "--socket", os.path.join(d, "s.sock"),
                                "--state-dir", os.path.join(d, "state"), "--http-listen",
                                "0.0.0.0:%d" % port, "--http-key-file", key],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("http_listen 0.0.0.0:%d is not a loopback address: other machines "
                          "could reach it; set http_listen_public = yes (or "
                          "--http-listen-public yes) to mean it" % port, p.stderr)
        finally:
            shutil.rmtree(d)
        e = Daemon(["--http-listen", "0.0.0.0:%d" % free_port(), "--http-key-file", D.key,
                    "--http-listen-public", "yes"], tcp=False)
        try:
            log = e.logtext()
        finally:
            self.assertEqual(e.stop(), 0)
        self.assertIn("warning: HTTP listens on 0.0.0.0", log)


if __name__ == "__main__":
    unittest.main(verbosity=2)
