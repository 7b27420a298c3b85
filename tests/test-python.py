#!/usr/bin/python3
"""The Python client (python/, import name sinkd) against a live daemon
on the test model: every method, the typed errors, and that the package
installs without the network (pip install --no-build-isolation).

Environment (from meson): SK_SINKD, SK_MODEL, SK_PYTHON_DIR.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

SINKD = os.environ["SK_SINKD"]
MODEL = os.environ["SK_MODEL"]
PYDIR = os.environ["SK_PYTHON_DIR"]
PROMPT = "Once upon a time"

# The package as pip installs it, offline: the tests import that copy.
SITE = tempfile.mkdtemp(prefix="sinkd-py-")
_p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                     "--no-build-isolation", "--no-index", "--target", SITE, PYDIR],
                    capture_output=True, text=True,
                    env=dict(os.environ, PIP_NO_CACHE_DIR="1"))
if _p.returncode != 0:
    sys.exit("pip install --no-build-isolation %s failed:\n%s" % (PYDIR, _p.stderr))
sys.path.insert(0, SITE)
import sinkd  # noqa: E402

assert sinkd.__file__.startswith(SITE), sinkd.__file__


class Live(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sinkd-pytest-")
        cls.sock = os.path.join(cls.dir, "sinkd.sock")
        cls.log = open(os.path.join(cls.dir, "log"), "w")
        cls.proc = subprocess.Popen(
            [SINKD, "--model", MODEL, "--socket", cls.sock, "--state-dir",
             os.path.join(cls.dir, "state"), "--threads", "1", "--http-socket", "none",
             "--chat-template", "chatml"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                with sinkd.Client(socket=cls.sock) as c:
                    c.ping()
                break
            except sinkd.IOError_:
                time.sleep(0.05)
        cls.c = sinkd.Client(socket=cls.sock, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.proc.terminate()
        rc = cls.proc.wait(30)
        shutil.rmtree(cls.dir, ignore_errors=True)
        shutil.rmtree(SITE, ignore_errors=True)
        assert rc == 0, "sinkd exited %d" % rc

    def test_readme_example(self):
        # The README's example runs as printed and leaves no session.
        with open(os.path.join(PYDIR, "..", "README.md")) as f:
            readme = f.read()
        start = readme.index("```", readme.index("Python (`pip install"))
        code = readme[readme.index("\n", start) + 1:readme.index("```", start + 3)]
        self.assertIn("sinkd.Client()", code)
        before = [x["session"] for x in self.c.list()]
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, SINKD_SOCKET=self.sock,
                                                 PYTHONPATH=SITE))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout)
        self.assertEqual([x["session"] for x in self.c.list()], before)

    def test_hello(self):
        h = self.c.hello()
        self.assertEqual(h["server"], "sinkd")
        self.assertEqual(h["protocol"], 1)
        self.assertEqual(h["model"]["n_vocab"], 512)

    def test_generate_and_stats(self):
        c = self.c
        s = c.open(policy="window", window=32)
        r = c.append(s, PROMPT)
        n_prompt = len(c.tokenize(PROMPT))
        self.assertEqual(r["n_tokens"], n_prompt)
        self.assertEqual(r["seen"], n_prompt)
        res = {}
        pieces = list(c.generate(s, max_tokens=40, temperature=0, result=res))
        self.assertEqual(res["stop"], "length")
        self.assertEqual(res["n_tokens"], 40)
        self.assertEqual(res["usage"]["completion_tokens"], 40)
        self.assertEqual(len(pieces), 40 + (1 if res.get("text") else 0))
        st = c.stats(s)
        self.assertEqual(st["resident"], 32)
        self.assertEqual(st["seen"], res["seen"])
        self.assertEqual(st["evicted"], st["seen"] - 32)
        # The same greedy text from a fresh session: the iterator lost nothing.
        s2 = c.open(policy="window", window=32)
        c.append(s2, PROMPT)
        again = "".join(c.generate(s2, max_tokens=40, temperature=0))
        self.assertEqual("".join(pieces), again)
        # Speculation by look-up in the session's history: the same text.
        s3 = c.open(policy="window", window=32, speculation="lookup", draft_tokens=4)
        c.append(s3, PROMPT)
        res3 = {}
        spec = "".join(c.generate(s3, max_tokens=40, temperature=0, result=res3))
        self.assertEqual("".join(pieces), spec)
        st3 = c.stats(s3)["speculation"]
        self.assertEqual(st3["mode"], "lookup")
        self.assertEqual(st3["draft_tokens"], 4)
        self.assertEqual(st3["drafted"], res3["usage"]["drafted_tokens"])
        self.assertEqual(st3["accepted"], res3["usage"]["accepted_tokens"])
        self.assertEqual(st3["rejected"], st3["drafted"] - st3["accepted"])
        off = "".join(c.generate(s3, max_tokens=4, temperature=0, speculation="off",
                                 result=res3))
        self.assertEqual(res3["usage"]["drafted_tokens"], 0)
        self.assertEqual(len(off) > 0, True)
        c.close_session(s3)
        self.assertIn(s, [x["session"] for x in c.list()])
        c.close_session(s)
        c.close_session(s2)
        with self.assertRaises(sinkd.NoSuchSession) as e:
            c.stats(s)
        self.assertEqual(e.exception.code, "no_such_session")

    def test_fork_export_import(self):
        c = self.c
        s = c.open(policy="dense", capacity=64)
        c.append(s, PROMPT)
        f = c.fork(s)
        a = "".join(c.generate(s, max_tokens=8, temperature=0))
        b = "".join(c.generate(f, max_tokens=8, temperature=0))
        self.assertEqual(a, b)
        image = c.export(f)
        self.assertEqual(c.stats(f)["seen"], len(c.tokenize(PROMPT)) + 8)
        g = c.import_(image)
        self.assertNotEqual(g, f)
        self.assertEqual(c.stats(g)["seen"], c.stats(f)["seen"])
        self.assertEqual("".join(c.generate(g, max_tokens=4, temperature=0)),
                         "".join(c.generate(f, max_tokens=4, temperature=0)))
        for x in (s, f, g):
            c.close_session(x)

    def test_errors(self):
        c = self.c
        with self.assertRaises(sinkd.BadRequest) as e:
            c.open(policy="lru")
        self.assertIn("lru", e.exception.message)
        with self.assertRaises(sinkd.UnknownOp):
            c.call("nope")
        s = c.open(policy="dense", capacity=4)
        with self.assertRaises(sinkd.ContextFull):
            c.append(s, tokens=[1, 2, 3, 4, 5])
        c.close_session(s)
        self.assertTrue(issubclass(sinkd.Busy, sinkd.SinkdError))
        with self.assertRaises(sinkd.IOError_):
            sinkd.Client(socket=os.path.join(self.dir, "none.sock"))
        # The connection still works after the errors.
        c.ping()

    def test_chat(self):
        c = self.c
        s = c.open(policy="dense", capacity=256)
        res = {}
        msgs = [{"role": "user", "content": "Tell me a story."}]
        text = "".join(c.chat(s, msgs, max_tokens=8, temperature=0, result=res))
        self.assertEqual(res["n_tokens"], 8)
        self.assertEqual(res["stop"], "length")
        seen = c.stats(s)["seen"]
        self.assertEqual(seen, res["usage"]["prompt_tokens"] + 8)
        # Only the new message is sent the second time.
        res2 = {}
        list(c.chat(s, [{"role": "user", "content": "More."}], max_tokens=4, temperature=0,
                    result=res2))
        self.assertEqual(c.stats(s)["seen"], res2["seen"])
        self.assertLess(res2["usage"]["prompt_tokens"], res["usage"]["prompt_tokens"] + 8)
        with self.assertRaises(sinkd.BadRequest):
            list(c.chat(s, [{"role": "Bad Role", "content": "x"}]))
        self.assertTrue(text)
        c.close_session(s)

    def test_cancel(self):
        c = self.c
        s = c.open()
        c.append(s, PROMPT)
        other = sinkd.Client(socket=self.sock, timeout=60)
        res = {}
        it = c.generate(s, max_tokens=100000, result=res)
        next(it)
        self.assertTrue(other.cancel(s))
        rest = list(it)
        self.assertEqual(res["stop"], "cancelled")
        self.assertLess(len(rest), 100000)
        other.close()
        c.close_session(s)


if __name__ == "__main__":
    unittest.main(verbosity=2)
