#!/usr/bin/python3
"""The Python client (python/, import name sinkd) against a live daemon
on the test model: installed as the README says (into a fresh virtual
environment, without the network, by root and by an unprivileged user
when run as root) with nothing written into the checkout, then every
method and the typed errors.

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
TOP = os.path.dirname(os.path.abspath(PYDIR))
PROMPT = "Once upon a time"
VENV_IN_README = "~/.local/sinkd-venv"

with open(os.path.join(TOP, "README.md")) as _f:
    README = _f.read()


def readme_block(after):
    """The first code block of the README after the text `after`."""
    start = README.index("```", README.index(after))
    return README[README.index("\n", start) + 1:README.index("```", start + 3)]


def git_status():
    """The checkout's state, ignored files of python/ included (a build
    folder or an egg-info there would be ignored by .gitignore rules
    elsewhere)."""
    p = subprocess.run(["git", "-C", TOP, "status", "--porcelain", "--ignored", "--untracked-files=all",
                        "--", "python"], capture_output=True, text=True)
    return p.returncode, p.stdout


def install_as_readme(home, user=None):
    """Runs the README's install commands with HOME=home (as user, a
    (uid, gid) pair, if given) in the checkout, offline: pip may not
    reach an index, and a proxy that does not exist stands in for the
    network. Returns the venv's folder."""
    venv = os.path.join(home, ".local", "sinkd-venv")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           "PIP_NO_CACHE_DIR": "1", "http_proxy": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for line in readme_block("installed into a virtual environment").strip().splitlines():
        cmd = ["bash", "-c", line]
        if user:
            cmd = ["setpriv", "--reuid=%d" % user[0], "--regid=%d" % user[1],
                   "--clear-groups", "--"] + cmd
        # the README's own interpreter: Debian's (not a pyenv or a venv's)
        p = subprocess.run(cmd, cwd=TOP, env=env, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            sys.exit("the README's `%s` failed:\n%s%s" % (line, p.stdout, p.stderr))
    return venv


# The package as the README installs it: the tests import that copy.
_before = git_status()
HOME = tempfile.mkdtemp(prefix="sinkd-py-")
VENV = install_as_readme(HOME)
assert git_status() == _before, "the install wrote into the checkout:\n" + git_status()[1]
SITE = subprocess.run([os.path.join(VENV, "bin", "python"), "-c",
                       "import sinkd, os; print(os.path.dirname(os.path.dirname(sinkd.__file__)))"],
                      capture_output=True, text=True, check=True).stdout.strip()
sys.path.insert(0, SITE)
import sinkd  # noqa: E402

assert sinkd.__file__.startswith(VENV), sinkd.__file__


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
        shutil.rmtree(HOME, ignore_errors=True)
        assert rc == 0, "sinkd exited %d" % rc

    def test_readme_example(self):
        # The README's example runs as printed, with the venv's python,
        # and leaves no session.
        install = README.index("installed into a virtual environment")
        start = README.index("```", README.index("```", install) + 3)  # after the install
        start = README.index("```", start + 3)
        code = README[README.index("\n", start) + 1:README.index("```", start + 3)]
        self.assertIn("sinkd.Client()", code)
        before = [x["session"] for x in self.c.list()]
        p = subprocess.run([os.path.join(VENV, "bin", "python"), "-c", code],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, SINKD_SOCKET=self.sock))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout)
        self.assertEqual([x["session"] for x in self.c.list()], before)

    @unittest.skipUnless(os.getuid() == 0 and shutil.which("setpriv"),
                         "the install as a user runs when the suite runs as root")
    def test_install_as_a_user(self):
        # The same commands as uid 65534 (nobody), who may not write into
        # the checkout: the install writes nothing there, and the client
        # it installed runs.
        home = tempfile.mkdtemp(prefix="sinkd-py-user-")
        try:
            os.chown(home, 65534, 65534)
            before = git_status()
            venv = install_as_readme(home, user=(65534, 65534))
            self.assertEqual(git_status(), before)
            p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                "--", os.path.join(venv, "bin", "python"), "-c",
                                "import sinkd\ntry:\n    sinkd.Client(socket='/nonexistent')\n"
                                "except OSError as e:\n    print(type(e).__name__, e.errno)"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout, "ConnectError 2\n")
        finally:
            shutil.rmtree(home, ignore_errors=True)

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
