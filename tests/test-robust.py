#!/usr/bin/python3
"""The daemon against what surrounds it, on the test model: files it reads
that are not what they should be (a FIFO, /dev/zero), a state directory
others may write in and a user planting symbolic links in it while the
daemon writes, session ids at their limit, stray signals, set-aside
sessions and their conversations, and imports that hold memory. Runs as
root (it switches to the uids nobody and daemon for the other users);
skipped otherwise.

Environment (from meson): SK_SINKD, SK_MODEL, SK_PYTHON_DIR.
"""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.environ.get("SK_PYTHON_DIR",
                                  os.path.join(os.path.dirname(__file__), "..", "python")))
import sinkd  # noqa: E402

SINKD = os.environ["SK_SINKD"]
MODEL = os.environ["SK_MODEL"]
NOBODY, DAEMON = 65534, 1
PY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(sinkd.__file__)))


def die_with_test():
    """In a child about to exec: SIGKILL when the test process dies (a
    failed assertion, a timeout), so that no daemon or client outlives
    it (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, 9)


class Daemon:
    """A sinkd on a folder of its own (sockets, state directory, log)."""

    def __init__(self, extra=(), state=None, config=None, start=True):
        self.dir = tempfile.mkdtemp(prefix="sinkd-robust-")
        os.chmod(self.dir, 0o755)
        self.sock = os.path.join(self.dir, "sinkd.sock")
        self.state = state or os.path.join(self.dir, "state")
        self.logpath = os.path.join(self.dir, "log")
        self.extra = list(extra)
        self.config = config
        self.proc = None
        self.log = None
        if start:
            self.start()

    def args(self):
        return [SINKD, "--config", self.config or "/dev/null", "--model", MODEL, "--socket",
                self.sock, "--state-dir", self.state, "--threads", "1", "--http-socket",
                "none", "--chat-template", "chatml"] + self.extra

    def start(self, wait=True, timeout=30):
        self.log = open(self.logpath, "a")
        self.proc = subprocess.Popen(self.args(), stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=die_with_test)
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("sinkd exited %d:\n%s" % (self.proc.returncode,
                                                              self.logtext()))
            try:
                with sinkd.Client(socket=self.sock, timeout=5) as c:
                    c.ping()
                os.chmod(self.sock, 0o666)
                return
            except sinkd.SinkdError:
                time.sleep(0.05)
        raise RuntimeError("sinkd did not start within %d s:\n%s" % (timeout, self.logtext()))

    def client(self, timeout=30):
        return sinkd.Client(socket=self.sock, timeout=timeout)

    def logtext(self):
        if self.log and not self.log.closed:
            self.log.flush()
        with open(self.logpath, errors="replace") as f:
            return f.read()

    def stop(self, expect=0):
        rc = None
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        elif self.proc:
            rc = self.proc.returncode
        if self.log:
            self.log.close()
        if rc != expect:
            print("---- sinkd log ----\n" + self.logtext(), file=sys.stderr)
        return rc

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def run_sinkd(args, timeout=10):
    """sinkd run to its end (or killed after timeout): (status, output)."""
    p = subprocess.Popen([SINKD] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace", preexec_fn=die_with_test)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        return None, out


def as_user(uid, script, *args, timeout=120):
    """Runs a Python script as uid (with the sinkd module): its stdout."""
    p = subprocess.run([sys.executable, "-c", script] + [str(a) for a in args], user=uid,
                       group=uid, extra_groups=[], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, PYTHONPATH=PY_DIR))
    if p.returncode != 0:
        raise RuntimeError("script as uid %d failed:\n%s" % (uid, p.stderr))
    return p.stdout


STORY = [{"role": "user", "content": "Tell me a story."}]


def chat_once(c, sid, text="Tell me a story."):
    return "".join(c.chat(sid, [{"role": "user", "content": text}], max_tokens=4,
                          temperature=0))


class ReadFiles(unittest.TestCase):
    """Every file sinkd reads is a regular file of bounded size, checked
    before it is read: a FIFO or a device never hangs it."""

    def test_config_dev_zero_at_start(self):
        rc, out = run_sinkd(["--config", "/dev/zero", "--model", MODEL, "--check-config"])
        self.assertEqual(rc, 2, out[-500:])
        self.assertIn("/dev/zero is a character device, not a regular file", out)

    def test_hello_after_a_reload(self):
        """A reload frees the configuration it replaces: what the server
        keeps of it (the model's path in hello) must be its own."""
        d = tempfile.mkdtemp()
        try:
            conf = os.path.join(d, "sinkd.conf")
            with open(conf, "w") as f:
                f.write("[limits]\nmax_sessions = 8\n")
            daemon = Daemon(config=conf)
            try:
                with open(conf, "w") as f:
                    f.write("[limits]\nmax_sessions = 7\n")
                daemon.proc.send_signal(signal.SIGHUP)
                deadline = time.time() + 10
                while "reloaded" not in daemon.logtext() and time.time() < deadline:
                    time.sleep(0.05)
                with daemon.client(timeout=5) as c:
                    self.assertEqual(c.stats()["max_sessions"], 7)
                    for _ in range(3):
                        self.assertEqual(c.hello()["model"]["file"], MODEL)
            finally:
                self.assertEqual(daemon.stop(), 0)
                daemon.remove()
        finally:
            shutil.rmtree(d)

    def test_config_dev_zero_on_reload(self):
        d = tempfile.mkdtemp()
        try:
            conf = os.path.join(d, "sinkd.conf")
            with open(conf, "w") as f:
                f.write("[limits]\nmax_sessions = 8\n")
            daemon = Daemon(config=conf)
            try:
                os.unlink(conf)
                os.symlink("/dev/zero", conf)
                rss0 = rss_kib(daemon.proc.pid)
                daemon.proc.send_signal(signal.SIGHUP)
                time.sleep(1.0)
                with daemon.client(timeout=5) as c:
                    t = time.time()
                    c.ping()
                    self.assertLess(time.time() - t, 1.0)
                    self.assertEqual(c.stats()["max_sessions"], 8)
                self.assertLess(rss_kib(daemon.proc.pid) - rss0, 64 * 1024)
                log = daemon.logtext()
                self.assertIn("cannot read the configuration: %s is a character device, not a "
                              "regular file" % conf, log)
                self.assertIn("reload: %s has errors; keeping the running configuration" % conf,
                              log)
            finally:
                self.assertEqual(daemon.stop(), 0)
                daemon.remove()
        finally:
            shutil.rmtree(d)

    def test_key_file_fifo(self):
        d = tempfile.mkdtemp()
        try:
            key = os.path.join(d, "key")
            os.mkfifo(key, 0o600)
            t = time.time()
            rc, out = run_sinkd(["--config", "/dev/null", "--model", MODEL, "--socket",
                                 os.path.join(d, "s.sock"), "--state-dir",
                                 os.path.join(d, "state"), "--http-listen", "127.0.0.1:1",
                                 "--http-key-file", key], timeout=30)
            self.assertEqual(rc, 2, out[-500:])
            self.assertLess(time.time() - t, 20)
            self.assertIn("http_key_file %s: must be a regular file of mode 0600 (it is not a "
                          "regular file: a FIFO)" % key, out)
        finally:
            shutil.rmtree(d)

    def test_sparsity_file_fifo(self):
        d = tempfile.mkdtemp()
        try:
            f = os.path.join(d, "sparsity")
            os.mkfifo(f, 0o600)
            rc, out = run_sinkd(["--config", "/dev/null", "--model", MODEL, "--socket",
                                 os.path.join(d, "s.sock"), "--state-dir",
                                 os.path.join(d, "state"), "--sparsity-file", f], timeout=30)
            self.assertEqual(rc, 2, out[-500:])
            self.assertIn("%s is a FIFO, not a regular file" % f, out)
        finally:
            shutil.rmtree(d)

    def test_model_fifo(self):
        d = tempfile.mkdtemp()
        try:
            f = os.path.join(d, "model.gguf")
            os.mkfifo(f, 0o600)
            rc, out = run_sinkd(["--config", "/dev/null", "--model", f, "--socket",
                                 os.path.join(d, "s.sock"), "--state-dir",
                                 os.path.join(d, "state")], timeout=30)
            self.assertEqual(rc, 1, out[-500:])
            self.assertIn("%s is a FIFO, not a regular file" % f, out)
        finally:
            shutil.rmtree(d)

    def test_conversation_fifo(self):
        # A FIFO where a session's conversation was: the daemon starts,
        # serves, and says why the conversation was not restored.
        daemon = Daemon()
        try:
            with daemon.client() as c:
                sid = c.open()
                chat_once(c, sid)
            self.assertEqual(daemon.stop(), 0)
            chat = os.path.join(daemon.state, "session-%d.chat" % sid)
            self.assertTrue(os.path.isfile(chat))
            os.unlink(chat)
            os.mkfifo(chat, 0o600)
            daemon.start(timeout=20)
            with daemon.client() as c:
                self.assertEqual(c.stats(sid)["session"], sid)
                chat_once(c, sid, "Go on.")
            self.assertIn("session %d: conversation not restored (it starts afresh): "
                          "session-%d.chat is a FIFO, not a regular file" % (sid, sid),
                          daemon.logtext())
        finally:
            self.assertEqual(daemon.stop(), 0)
            daemon.remove()


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# Run as nobody: plants symbolic links to a root-owned file at every name
# the daemon's conversation save has used (session-N.chat.tmp, the file
# itself), in a loop, until its stdin closes; prints how many it made.
PLANTER = r"""
import os, sys, threading
d, target, sid = sys.argv[1], sys.argv[2], sys.argv[3]
names = ["session-%s.chat.tmp" % sid, "session-%s.chat" % sid]
stop = []
threading.Thread(target=lambda: (sys.stdin.read(), stop.append(1)), daemon=True).start()
n = 0
while not stop:
    for name in names:
        try:
            os.symlink(target, os.path.join(d, name))
            n += 1
        except OSError:
            pass
print(n, flush=True)
"""


class WrittenFiles(unittest.TestCase):
    """No file the daemon writes can be redirected."""

    def test_state_dir_writable_by_others_refused(self):
        d = tempfile.mkdtemp()
        try:
            state = os.path.join(d, "state")
            os.mkdir(state, 0o700)
            os.chmod(state, 0o777)
            rc, out = run_sinkd(["--config", "/dev/null", "--model", MODEL, "--socket",
                                 os.path.join(d, "s.sock"), "--state-dir", state], timeout=30)
            self.assertEqual(rc, 1, out[-500:])
            self.assertIn("%s is writable by everyone (mode 0777): other users could replace "
                          "the files the daemon writes there; chmod go-w %s (or set the "
                          "sticky bit: chmod +t)" % (state, state), out)
            os.chmod(state, 0o770)
            rc, out = run_sinkd(["--config", "/dev/null", "--model", MODEL, "--socket",
                                 os.path.join(d, "s.sock"), "--state-dir", state], timeout=30)
            self.assertEqual(rc, 1, out[-500:])
            self.assertIn("is writable by its group (mode 0770)", out)
        finally:
            shutil.rmtree(d)

    def test_symlink_race_on_the_conversation_file(self):
        # A sticky, world-writable state directory (accepted: others may
        # add entries, not rename or remove the daemon's). nobody plants
        # links to a root-owned file at the conversation's names while
        # root chats: the file is never written through a link, and the
        # conversation is saved and restored.
        base = tempfile.mkdtemp()
        os.chmod(base, 0o755)
        state = os.path.join(base, "state")
        os.mkdir(state)
        os.chmod(state, 0o1777)
        target = os.path.join(base, "precious")
        with open(target, "w") as f:
            f.write("root's own\n")
        os.chmod(target, 0o644)
        daemon = Daemon(state=state)
        planter = None
        try:
            with daemon.client() as c:
                sid = c.open()
                planter = subprocess.Popen([sys.executable, "-c", PLANTER, state, target,
                                            str(sid)], user=NOBODY, group=NOBODY,
                                           extra_groups=[], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True)
                time.sleep(0.2)
                for i in range(20):
                    chat_once(c, sid, "Turn %d." % i)
                planter.stdin.close()
                planted = int(planter.stdout.read().strip() or 0)
                planter.stdout.close()
                planter.wait(10)
            with open(target, "rb") as f:
                self.assertEqual(f.read(), b"root's own\n")
            self.assertGreater(planted, 0)
            chat = os.path.join(state, "session-%d.chat" % sid)
            st = os.lstat(chat)
            self.assertTrue(os.path.isfile(chat) and not os.path.islink(chat))
            self.assertEqual((st.st_uid, st.st_mode & 0o777), (0, 0o600))
            self.assertEqual(daemon.stop(), 0)
            daemon.start()
            with daemon.client() as c:
                self.assertEqual(c.stats(sid)["session"], sid)
            self.assertNotIn("conversation not restored", daemon.logtext())
        finally:
            if planter and planter.poll() is None:
                planter.kill()
                planter.wait()
            self.assertEqual(daemon.stop(), 0)
            daemon.remove()
            shutil.rmtree(base)

    def test_planted_conversation_refused(self):
        # A conversation file another user planted (in a sticky directory)
        # or a link in its place is not read.
        base = tempfile.mkdtemp()
        os.chmod(base, 0o755)
        state = os.path.join(base, "state")
        os.mkdir(state)
        os.chmod(state, 0o1777)
        daemon = Daemon(state=state)
        try:
            with daemon.client() as c:
                a, b = c.open(), c.open()
                chat_once(c, a)
                chat_once(c, b)
            self.assertEqual(daemon.stop(), 0)
            ca = os.path.join(state, "session-%d.chat" % a)
            cb = os.path.join(state, "session-%d.chat" % b)
            os.chown(ca, NOBODY, NOBODY)
            os.unlink(cb)
            os.symlink("/etc/passwd", cb)
            daemon.start()
            log = daemon.logtext()
            self.assertIn("session %d: conversation not restored (it starts afresh): "
                          "session-%d.chat is owned by uid 65534, not by the daemon's uid 0"
                          % (a, a), log)
            self.assertIn("session %d: conversation not restored (it starts afresh): "
                          "session-%d.chat is a symbolic link; not following it" % (b, b), log)
        finally:
            self.assertEqual(daemon.stop(), 0)
            daemon.remove()
            shutil.rmtree(base)


class SetAside(unittest.TestCase):
    def test_conversation_goes_with_its_session(self):
        daemon = Daemon()
        try:
            with daemon.client() as c:
                sid = c.open()
                chat_once(c, sid)
            self.assertEqual(daemon.stop(), 0)
            obj = os.path.join(daemon.state, "session-%d.skv" % sid)
            with open(obj, "r+b") as f:
                f.truncate(4096)
            daemon.start()
            inv = os.path.join(daemon.state, "invalid")
            self.assertEqual(sorted(os.listdir(inv)),
                             ["session-%d.chat" % sid, "session-%d.skv" % sid])
            self.assertFalse(os.path.exists(os.path.join(daemon.state,
                                                         "session-%d.chat" % sid)))
            self.assertIn("state: %s/session-%d.chat set aside as %s/invalid/session-%d.chat "
                          "with its session" % (daemon.state, sid, daemon.state, sid),
                          daemon.logtext())
        finally:
            self.assertEqual(daemon.stop(), 0)
            daemon.remove()


ID_MAX = (1 << 53) - 1


class SessionIds(unittest.TestCase):
    def test_ids_never_wrap(self):
        # The id of the next session, as the lock file remembers it, at
        # the largest id and past it: ids end there, nothing wraps.
        daemon = Daemon(start=False)
        for next_id, opens in [(ID_MAX, 1), (ID_MAX + 1, 0), ((1 << 64) - 1, 0)]:
            with self.subTest(next_id=next_id):
                shutil.rmtree(daemon.state, ignore_errors=True)
                os.makedirs(daemon.state, mode=0o700)
                with open(os.path.join(daemon.state, "lock"), "w") as f:
                    f.write("%d\n" % next_id)
                daemon.start()
                try:
                    with daemon.client() as c:
                        got = []
                        for _ in range(opens):
                            got.append(c.open(temporary=True))
                        self.assertEqual(got, [ID_MAX] * opens)
                        with self.assertRaises(sinkd.SinkdError) as cm:
                            c.open(temporary=True)
                        self.assertEqual(cm.exception.code, "busy")
                        self.assertEqual(str(cm.exception.args[0]),
                                         "no session id left: this state directory has used "
                                         "every id up to %d" % ID_MAX)
                        c.ping()
                finally:
                    self.assertEqual(daemon.stop(), 0)
        daemon.remove()

    def test_huge_ids_at_restart(self):
        # Object names with ids past the largest (or past 64 bits) are
        # set aside with a reason, not ignored, and take no id.
        daemon = Daemon()
        try:
            with daemon.client() as c:
                sid = c.open()
            self.assertEqual(daemon.stop(), 0)
            src = os.path.join(daemon.state, "session-%d.skv" % sid)
            huge = ["session-%d.skv" % (ID_MAX + 1), "session-99999999999999999999999.skv"]
            for name in huge:
                shutil.copy(src, os.path.join(daemon.state, name))
            daemon.start()
            with daemon.client() as c:
                self.assertEqual(c.open(temporary=True), sid + 1)
            log = daemon.logtext()
            for name in huge:
                self.assertIn("state: %s/%s set aside as %s/invalid/%s: the id is larger than "
                              "the largest session id, %d" % (daemon.state, name, daemon.state,
                                                              name, ID_MAX), log)
        finally:
            self.assertEqual(daemon.stop(), 0)
            daemon.remove()


class Signals(unittest.TestCase):
    def test_stray_signals_do_not_stop_the_daemon(self):
        daemon = Daemon()
        try:
            for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
                daemon.proc.send_signal(sig)
            time.sleep(0.5)
            self.assertIsNone(daemon.proc.poll(), daemon.logtext())
            with daemon.client() as c:
                c.ping()
        finally:
            self.assertEqual(daemon.stop(), 0)
            self.assertIn("shutting down", daemon.logtext())
            daemon.remove()


# Run as another uid: an import of total bytes, sent in chunks up to
# `upto` bytes; prints each reply ("received N" or "error CODE MESSAGE").
# Then (hold > 0) keeps the connection for hold seconds and prints any
# frame the daemon sends meanwhile, then one more chunk's reply; then
# (cap > 0) an open of capacity cap (rope_scale so the model takes it).
IMPORTER = r"""
import sys, time, sinkd
sock, total, upto = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hold, cap = float(sys.argv[4]), int(sys.argv[5])
c = sinkd.Client(socket=sock, timeout=30)
chunk = 512 * 1024
off = 0
while off < upto:
    n = min(chunk, upto - off)
    try:
        r = c.call("import", total=total, offset=off, data=b"\0" * n)
        off += n
        last = "received %d" % off
    except sinkd.SinkdError as e:
        last = "error %s %s" % (e.code, e.args[0])
        print(last, flush=True)
        break
else:
    print(last, flush=True)
if cap:
    try:
        s = c.open(policy="dense", capacity=cap, rope_scale=16.0)
        print("open ok %d" % s, flush=True)
    except sinkd.SinkdError as e:
        print("open error %s %s" % (e.code, e.args[0]), flush=True)
if hold:
    c._sock.settimeout(hold)
    try:
        msg = c._read_frame()
        err = msg.get("error", {})
        print("frame %s %s" % (err.get("code"), err.get("message")), flush=True)
    except Exception as e:
        print("frame none %s" % type(e).__name__, flush=True)
    try:
        c.call("import", total=total, offset=off, data=b"\0" * 16)
        print("chunk ok", flush=True)
    except sinkd.SinkdError as e:
        print("chunk error %s %s" % (e.code, e.args[0]), flush=True)
"""

MIB = 1 << 20


class Imports(unittest.TestCase):
    def test_imports_count_toward_the_uid(self):
        daemon = Daemon(["--max-memory", "96M", "--max-user-memory", "48M",
                         "--frame-timeout", "2"])
        try:
            # Past its share (48 MiB): refused as it grows, naming the limit.
            out = as_user(NOBODY, IMPORTER, daemon.sock, 90 * MIB, 90 * MIB - 1000, 0, 0)
            self.assertEqual(out.strip(),
                             "error busy memory limit: uid 65534's imports in progress would "
                             "bring it to %d bytes with its sessions (max_user_memory %d)"
                             % (64 * MIB, 48 * MIB))
            # Within its share, held: it counts when the uid opens a session.
            out = as_user(NOBODY, IMPORTER, daemon.sock, 46 * MIB, 45 * MIB, 0, 8192)
            lines = out.strip().split("\n")
            self.assertEqual(lines[0], "received %d" % (45 * MIB))
            self.assertTrue(lines[1].startswith("open error busy a session of "), lines[1])
            self.assertIn("would bring uid 65534 to ", lines[1])
            self.assertIn("(max_user_memory %d)" % (48 * MIB), lines[1])
            # Another uid is not held back by it.
            with daemon.client() as c:
                sid = c.open()
                c.append(sid, "Once upon a time")
                image = c.export(sid)
            script = ("import sys, sinkd\nc = sinkd.Client(socket=sys.argv[1])\n"
                      "print(c.import_(open(sys.argv[2], 'rb').read()))\n")
            path = os.path.join(daemon.dir, "image")
            with open(path, "wb") as f:
                f.write(image)
            os.chmod(path, 0o644)
            self.assertGreater(int(as_user(DAEMON, script, daemon.sock, path)), sid)
        finally:
            self.assertEqual(daemon.stop(), 0)
            daemon.remove()

    def test_a_stalled_import_is_dropped(self):
        daemon = Daemon(["--frame-timeout", "2"])
        try:
            out = as_user(NOBODY, IMPORTER, daemon.sock, 8 * MIB, 4 * MIB, 4.0, 0)
            lines = out.strip().split("\n")
            self.assertEqual(lines[0], "received %d" % (4 * MIB))
            self.assertEqual(lines[1], "frame cancelled import stalled: no chunk for 2 s "
                                       "(frame_timeout); its 4194304 bytes are dropped: send "
                                       "it again from offset 0")
            self.assertEqual(lines[2], "chunk error bad_request no import in progress on this "
                                       "connection: the first chunk has offset 0")
        finally:
            self.assertEqual(daemon.stop(), 0)
            daemon.remove()


class StalledLoop(unittest.TestCase):
    def test_generation_waits_for_the_event_loop(self):
        """The loop thread held (ptrace: only the daemon's main thread is
        stopped, its compute thread goes on): the compute thread posts at
        most SK_LIMIT_JOB_EVENTS token events and then waits, instead of
        queueing the whole generation in memory (about 5 MB a second
        here). Afterwards the generation goes on and ends as asked."""
        daemon = Daemon()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        ptrace_seize, ptrace_interrupt, ptrace_detach = 0x4206, 0x4207, 17
        try:
            got = []
            stop = threading.Event()

            def generate():
                with daemon.client(timeout=60) as c:
                    sid = c.open(policy="streaming", n_sink=4, window=60)
                    for tok in c.generate(sid, prompt="Once upon a time", max_tokens=1000000,
                                          temperature=0):
                        got.append(tok)
                        if stop.is_set():
                            break

            th = threading.Thread(target=generate)
            th.start()
            deadline = time.time() + 30
            while len(got) < 100 and time.time() < deadline:
                time.sleep(0.01)
            self.assertGreaterEqual(len(got), 100)
            pid = daemon.proc.pid
            self.assertEqual(libc.ptrace(ptrace_seize, pid, None, None), 0, ctypes.get_errno())
            self.assertEqual(libc.ptrace(ptrace_interrupt, pid, None, None), 0)
            os.waitpid(pid, 0x40000000)  # __WALL: the main thread has stopped
            rss0 = rss_kib(pid)
            time.sleep(2)
            grown = rss_kib(pid) - rss0
            n_held = len(got)
            self.assertEqual(libc.ptrace(ptrace_detach, pid, None, None), 0)
            print("figures: RSS +%d KiB in 2 s with the loop thread stopped" % grown,
                  file=sys.stderr)
            self.assertLess(grown, 1024)
            # The held tokens arrive, then new ones.
            deadline = time.time() + 30
            while len(got) < n_held + 2000 and time.time() < deadline:
                time.sleep(0.01)
            self.assertGreaterEqual(len(got), n_held + 2000)
            stop.set()
            th.join(60)
            self.assertFalse(th.is_alive())
            with daemon.client() as c:
                c.ping()
        finally:
            self.assertEqual(daemon.stop(), 0)
            daemon.remove()



if __name__ == "__main__":
    if os.geteuid() != 0:
        print("skipped: needs root (it runs clients as nobody and daemon)")
        sys.exit(77)
    unittest.main(verbosity=2)
