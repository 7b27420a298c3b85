"""The daemon of the HTTP tests (test-http*.py) and the ways they reach
it: curl over its Unix socket, raw sockets, the msgpack protocol through
the Python client (python/) for sinkd's own figures. A test module imports
setUpModule and tearDownModule from here and reads the running daemon as
httpfixture.D.

Environment (from meson): SK_SINKD, SK_MODEL, SK_PYTHON_DIR.
"""
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.environ.get("SK_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "..", "python")))
sys.dont_write_bytecode = True  # nothing written into the checkout
import sinkd  # noqa: E402

SINKD = os.environ["SK_SINKD"]
MODEL = os.environ["SK_MODEL"]
PROMPT = "Once upon a time"
KEY = "sk-test-0123456789abcdef"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    def __init__(self, extra=(), model=MODEL, defaults=False, sessions=256, tcp=True):
        """A daemon on model: the settings below unless defaults (then
        only the socket, the state directory and extra); sessions: its
        max_user_sessions; tcp: whether it listens on TCP too."""
        self.dir = tempfile.mkdtemp(prefix="sinkd-http-")
        self.sock = os.path.join(self.dir, "sinkd.sock")
        self.http = os.path.join(self.dir, "sinkd-http.sock")
        self.key = os.path.join(self.dir, "key")
        with open(self.key, "w") as f:
            f.write(KEY + "\n")
        os.chmod(self.key, 0o600)
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "log"), "w+")
        args = [SINKD, "--model", model, "--socket", self.sock, "--state-dir",
                os.path.join(self.dir, "state"), "--config", "/dev/null"]
        if not defaults:
            args += ["--threads", "1", "--max-sessions", str(max(sessions, 64)),
                     "--max-user-sessions", str(sessions), "--window", "252",
                     "--chat-template", "chatml"]
            if tcp:
                args += ["--http-listen", "127.0.0.1:%d" % self.port, "--http-key-file",
                         self.key]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("sinkd exited %d:\n%s" % (self.proc.returncode, self.logtext()))
            try:
                with sinkd.Client(socket=self.sock, timeout=5) as c:
                    c.ping()
                if os.path.exists(self.http):
                    return
            except sinkd.SinkdError:
                pass
            time.sleep(0.05)
        raise RuntimeError("sinkd did not start:\n" + self.logtext())

    def logtext(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(30)
        if rc != 0:
            print("---- sinkd log ----\n" + self.logtext(), file=sys.stderr)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


D = None


def setUpModule():
    global D
    D = Daemon()


def tearDownModule():
    rc = D.stop()
    assert rc == 0, "sinkd exited %d" % rc


def curl(*args, data=None):
    cmd = ["curl", "-sS", "--max-time", "60", "--unix-socket", D.http]
    if data is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(data)]
    out = subprocess.run(cmd + ["-w", "\n%{http_code}"] + list(args), capture_output=True,
                         check=True)
    body, _, code = out.stdout.rpartition(b"\n")
    return int(code), body


def sse(body):
    """The data of the events of a text/event-stream body."""
    events = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            events.append(block[6:])
    return events


def raw(data, path=None, read_timeout=15, chunks=None):
    """Sends data (or the pieces of chunks) on a new connection and returns
    all it reads until the daemon closes it or read_timeout passes."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(path or D.http)
    s.settimeout(read_timeout)
    for piece in (chunks or [data]):
        try:
            s.sendall(piece)
        except OSError:
            break
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        out += b"<timeout>"
    except ConnectionResetError:
        out += b"<reset>"
    s.close()
    return out


def own_generate(prompt, **kw):
    """The same generation through the msgpack protocol: text and usage."""
    with sinkd.Client(socket=D.sock) as c:
        s = c.open(temporary=True)
        res = {}
        text = "".join(c.generate(s, prompt=prompt, result=res, **kw))
        return text, res


STORY = [{"role": "user", "content": "Tell me a story."}]


def status_of(resp):
    if not resp.startswith(b"HTTP/1.1 "):
        return None
    return int(resp[9:12])



def as_user(uid, script, *args):
    return subprocess.Popen([sys.executable, "-c", script] + [str(a) for a in args], user=uid,
                            group=uid, extra_groups=[], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def open_to_all(d):
    """Lets other uids reach daemon d's sockets (the test runs as root)."""
    os.chmod(d.dir, 0o755)
    os.chmod(d.http, 0o666)
    os.chmod(d.sock, 0o666)

