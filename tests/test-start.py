#!/usr/bin/python3
"""The daemon's start as a user meets it, on the test model: two daemons
whose sockets share a folder serve at once (each HTTP socket named after
its protocol socket); a socket or state directory in use is found before
the model loads; --check-config fails, before loading the model, on each
thing the start would fail on (the API key file missing, short, readable
by others, a FIFO, a folder; a socket, a TCP port or the state directory
in use) and otherwise prints a summary of the model; sinkctl --wait and
the Python client's wait= wait for a daemon that is starting.

Environment (from meson): SK_SINKD, SK_SINKCTL, SK_MODEL, SK_PYTHON_DIR.
"""
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.environ["SK_PYTHON_DIR"])
sys.dont_write_bytecode = True  # nothing written into the checkout
import sinkd  # noqa: E402

SINKD = os.environ["SK_SINKD"]
SINKCTL = os.environ["SK_SINKCTL"]
MODEL = os.environ["SK_MODEL"]
KEY = "sk-test-0123456789abcdef"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    """sinkd on sock (its state directory beside it), started and
    waited for."""

    def __init__(self, folder, name, extra=()):
        self.sock = os.path.join(folder, name + ".sock")
        self.state = os.path.join(folder, name + "-state")
        self.log = open(os.path.join(folder, name + ".log"), "w+")
        self.proc = subprocess.Popen(
            [SINKD, "--config", "/dev/null", "--model", MODEL, "--socket", self.sock,
             "--state-dir", self.state, "--threads", "1"] + list(extra),
            stdout=self.log, stderr=subprocess.STDOUT)
        with sinkd.Client(socket=self.sock, wait=30) as c:
            c.ping()

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(30)


def run(args, timeout=30):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def health(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    out = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        out += b
    s.close()
    return out.split(b"\r\n", 1)[0]


class TwoDaemons(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sinkd-start-")
        cls.a = Daemon(cls.dir, "a")
        cls.b = Daemon(cls.dir, "b")
        cls.bad_model = os.path.join(cls.dir, "not-a-model.gguf")
        with open(cls.bad_model, "wb") as f:
            f.write(b"this is not a GGUF file")

    @classmethod
    def tearDownClass(cls):
        rcs = [cls.a.stop(), cls.b.stop()]
        shutil.rmtree(cls.dir, ignore_errors=True)
        assert rcs == [0, 0], rcs

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_both_serve(self):
        # Each protocol socket answers, and each HTTP socket is named
        # after its own: a.sock gives a-http.sock, b.sock b-http.sock.
        for d, http in ((self.a, "a-http.sock"), (self.b, "b-http.sock")):
            with sinkd.Client(socket=d.sock) as c:
                c.ping()
                s = c.open(temporary=True)
                self.assertEqual(len("".join(c.generate(s, prompt="Once", max_tokens=3,
                                                        temperature=0))) > 0, True)
            self.assertEqual(health(self.path(http)), b"HTTP/1.1 200 OK")
        self.assertFalse(os.path.exists(self.path("sinkd-http.sock")))

    def start_fails(self, args, needle):
        """A start that must fail before it loads the model."""
        p = run([SINKD, "--config", "/dev/null", "--model", MODEL] + args)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(needle, p.stderr)
        self.assertNotIn("model loaded", p.stderr)
        return p.stderr

    def test_in_use_found_before_the_model(self):
        self.start_fails(["--socket", self.a.sock, "--state-dir", self.path("c-state")],
                         "%s is in use by a running daemon" % self.a.sock)
        # the HTTP socket, named after --socket (DIR/a gives a-http.sock
        # too): the message says how to choose another
        err = self.start_fails(["--socket", self.path("a"), "--state-dir",
                                self.path("c-state")],
                               "%s is in use by a running daemon" % self.path("a-http.sock"))
        self.assertIn("the HTTP socket is named after --socket: give each daemon its own "
                      "--socket, or set --http-socket", err)
        self.start_fails(["--socket", self.path("c.sock"), "--http-socket",
                          self.path("b-http.sock"), "--state-dir", self.path("c-state")],
                         "%s is in use by a running daemon" % self.path("b-http.sock"))
        self.start_fails(["--socket", self.path("c.sock"), "--state-dir", self.a.state],
                         "is in use by another sinkd")

    def check(self, args, model=None):
        return run([SINKD, "--check-config", "--config", "/dev/null", "--model",
                    model or self.bad_model, "--socket", self.path("c.sock"), "--state-dir",
                    self.path("c-state")] + args, timeout=20)

    def key_file(self, name, text=KEY, mode=0o600):
        path = self.path(name)
        with open(path, "w") as f:
            f.write(text + "\n")
        os.chmod(path, mode)
        return path

    def test_check_config_fails_before_the_model(self):
        port = free_port()
        tcp = ["--http-listen", "127.0.0.1:%d" % port]
        fifo = self.path("key-fifo")
        os.mkfifo(fifo, 0o600)
        folder = self.path("key-folder")
        os.mkdir(folder, 0o700)
        cases = [
            ("no key file", tcp, 2, "a TCP listener needs an API key"),
            ("key file missing", tcp + ["--http-key-file", self.path("nokey")], 2,
             "http_key_file %s: No such file or directory" % self.path("nokey")),
            ("key too short", tcp + ["--http-key-file", self.key_file("short", "abc")], 2,
             "the key must be one line of 16 to"),
            ("key readable by others", tcp + ["--http-key-file",
                                              self.key_file("open", mode=0o644)], 2,
             "must be a regular file of mode 0600 (it is 0644)"),
            ("key a FIFO", tcp + ["--http-key-file", fifo], 2,
             "must be a regular file of mode 0600 (it is not a regular file"),
            ("key a folder", tcp + ["--http-key-file", folder], 2,
             "must be a regular file of mode 0600 (it is not a regular file"),
            ("socket in use", ["--socket", self.a.sock], 1,
             "%s is in use by a running daemon" % self.a.sock),
            ("HTTP socket in use", ["--http-socket", self.path("a-http.sock")], 1,
             "%s is in use by a running daemon" % self.path("a-http.sock")),
            ("state directory in use", ["--state-dir", self.b.state], 1,
             "is in use by another sinkd"),
        ]
        for name, args, status, needle in cases:
            with self.subTest(name):
                t0 = time.monotonic()
                p = self.check(args)
                self.assertLess(time.monotonic() - t0, 10)  # a FIFO never blocks it
                self.assertEqual(p.returncode, status, p.stderr)
                self.assertIn(needle, p.stderr)
                # A configuration error (2) stops the check; a start
                # failure (1) does not: the model is checked too.
                if status == 2:
                    self.assertNotIn("cannot load model", p.stderr)
                else:
                    self.assertIn("cannot load model %s: bad magic" % self.bad_model, p.stderr)
                self.assertEqual(p.stdout, "")
        # A TCP port another program listens on.
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port_busy = busy.getsockname()[1]
        try:
            p = self.check(["--http-listen", "127.0.0.1:%d" % busy.getsockname()[1],
                            "--http-key-file", self.key_file("good")])
        finally:
            busy.close()
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("cannot listen for HTTP on 127.0.0.1:%d: Address already in use"
                      % port_busy, p.stderr)
        self.assertIn("cannot load model %s: bad magic" % self.bad_model, p.stderr)

    def test_check_config_names_every_problem(self):
        # The socket in use and the key file missing: both named, status 2.
        p = self.check(["--socket", self.a.sock, "--http-listen", "127.0.0.1:%d" % free_port(),
                        "--http-key-file", self.path("nokey")])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr, "sinkd: %s is in use by a running daemon\n"
                         "sinkd: http_key_file %s: No such file or directory\n"
                         % (self.a.sock, self.path("nokey")))
        # The state directory in use, the model good: the summary and the
        # configuration are printed, and the status is still 1.
        p = self.check(["--state-dir", self.b.state], model=MODEL)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr, "sinkd: state directory %s is in use by another sinkd\n"
                         % self.b.state)
        self.assertTrue(p.stdout.startswith("; model %s\n" % MODEL), p.stdout)
        self.assertIn("\nstate_dir = %s ; command line --state-dir\n" % self.b.state, p.stdout)

    def test_check_config_ok(self):
        # Every check passes: the model's summary, then the configuration,
        # the HTTP socket named after --socket.
        good = self.key_file("good2")
        p = self.check(["--http-listen", "127.0.0.1:%d" % free_port(), "--http-key-file", good,
                        "--http-uid", "65534"], model=MODEL)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        lines = p.stdout.splitlines()
        self.assertEqual(lines[0], "; model %s" % MODEL)
        self.assertEqual(lines[1], ";   llama (llama), GGUF v3, 1.2 MB, 0.29M parameters")
        self.assertEqual(lines[2], ";   5 layers, dim 64, FFN 172, 8 heads, 4 KV heads, "
                                   "head dim 8")
        self.assertEqual(lines[3], ";   weights f32 (of the parameters: f32 100.0%)")
        self.assertEqual(lines[4], ";   vocabulary 512 tokens, SentencePiece, BOS added")
        self.assertEqual(lines[5], ";   chat template none")
        self.assertEqual(lines[6], ";   context 2048 tokens (RoPE base 10000)")
        self.assertIn("http_socket = %s ; default (auto)" % self.path("c-http.sock"), p.stdout)
        # Run as root, TCP requests act as nobody, and nothing warns of root.
        if os.getuid() == 0:
            p = self.check(["--http-listen", "127.0.0.1:%d" % free_port(), "--http-key-file",
                            good], model=MODEL)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stderr, "")
            self.assertIn("http_uid = %d ; default (auto)" % pwd.getpwnam("nobody").pw_uid,
                          p.stdout)
        # The running daemon's own configuration (a check before a reload):
        # its sockets and state directory are its own.
        p = run([SINKD, "--check-config", "--config", "/dev/null", "--model", MODEL,
                 "--socket", self.a.sock, "--state-dir", self.a.state])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("; the daemon of this configuration runs on %s" % self.a.sock, p.stdout)


class Wait(unittest.TestCase):
    def test_wait_for_a_starting_daemon(self):
        # sinkctl --wait and Client(wait=) started before the daemon: both
        # get their answer once it has loaded; without --wait, exit 3.
        folder = tempfile.mkdtemp(prefix="sinkd-wait-")
        sock = os.path.join(folder, "w.sock")
        try:
            p = run([SINKCTL, "--socket", sock, "ping"])
            self.assertEqual(p.returncode, 3)
            waiting = subprocess.Popen([SINKCTL, "--socket", sock, "--wait=30", "ping"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
            got = {}

            def py():
                try:
                    with sinkd.Client(socket=sock, wait=30) as c:
                        got["hello"] = c.hello()
                except Exception as e:  # the test's assert below says so
                    got["error"] = e
            t = threading.Thread(target=py)
            t.start()
            time.sleep(0.5)
            self.assertIsNone(waiting.poll())  # still waiting
            d = Daemon(folder, "w")
            out, err = waiting.communicate(timeout=30)
            t.join(30)
            self.assertEqual(waiting.returncode, 0, err)
            self.assertTrue(out.startswith("pong"), out)
            self.assertNotIn("error", got)
            self.assertEqual(got["hello"]["model"]["n_layer"], 5)
            self.assertEqual(d.stop(), 0)
            # Gone again: --wait=1 gives up after a second, saying so; the
            # Python client raises ConnectError, an OSError.
            t0 = time.monotonic()
            p = run([SINKCTL, "--socket", sock, "--wait=1", "ping"])
            self.assertEqual(p.returncode, 3)
            self.assertIn("waited 1.000 s", p.stderr)
            self.assertGreaterEqual(time.monotonic() - t0, 1.0)
            with self.assertRaises(OSError) as cm:
                sinkd.Client(socket=sock, wait=0.2)
            self.assertIsInstance(cm.exception, sinkd.ConnectError)
            self.assertEqual(cm.exception.filename, sock)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
