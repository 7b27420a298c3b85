#!/usr/bin/python3
"""The README's by-hand steps ("Your own model": start sinkd in the
background, then sinkctl) run as a script, as printed, against a model
of the 1B shape (sinkd-mkmodel, Q4_0, 637 MB): they succeed without a
sleep, sinkctl --wait waiting while the model loads; the load logs its
progress and sends STATUS= lines to the service manager (NOTIFY_SOCKET,
read here), then READY=1.

Only paths change: the model, the socket in a folder of the test's (and
the daemon its own state directory and no configuration file, so that
nothing of the machine's is touched), ./build the build folder.

Environment (from meson): SK_BUILD_ROOT, SK_SOURCE_ROOT, SK_MKMODEL.
"""
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest

BUILD = os.environ["SK_BUILD_ROOT"]
TOP = os.environ["SK_SOURCE_ROOT"]
MKMODEL = os.environ["SK_MKMODEL"]


def readme_steps():
    with open(os.path.join(TOP, "README.md")) as f:
        readme = f.read()
    start = readme.index("```", readme.index("or by hand, after `./scripts/build.sh`:"))
    return readme[readme.index("\n", start) + 1:readme.index("```", start + 3)]


class ReadmeSteps(unittest.TestCase):
    def test_by_hand(self):
        steps = readme_steps()
        self.assertNotIn("sleep", steps)
        self.assertIn("--wait", steps)
        tmp = tempfile.mkdtemp(prefix="sinkd-readme-")
        try:
            model = os.path.join(tmp, "my-model.gguf")
            subprocess.run([MKMODEL, "-s", "1B", "-t", "q4_0", "-o", model], check=True,
                           capture_output=True, timeout=300)
            sock = os.path.join(tmp, "sinkd.sock")
            script = (steps.replace("~/models/my-model.gguf", model)
                      .replace("--socket /tmp/sinkd.sock",
                               "--socket %s --state-dir %s --config /dev/null"
                               % (sock, os.path.join(tmp, "state")))
                      .replace("/tmp/sinkd.sock", sock)
                      .replace("./build/", BUILD + "/"))
            self.assertNotIn("/tmp/sinkd.sock", script)
            notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            notify.bind(os.path.join(tmp, "notify"))
            notify.settimeout(0.2)
            # read as they come, as a service manager does: a datagram
            # queue left full would block the daemon's sd_notify
            msgs, done = [], threading.Event()

            def read_notify():
                while not done.is_set():
                    try:
                        msgs.append(notify.recv(4096).decode())
                    except socket.timeout:
                        pass
            reader = threading.Thread(target=read_notify)
            reader.start()
            env = dict(os.environ, NOTIFY_SOCKET=os.path.join(tmp, "notify"))
            env.pop("SINKD_SOCKET", None)
            # The daemon is the script's background job: stopped when the
            # script ends, however it ends.
            wrapped = "set -e\ntrap 'kill $! 2>/dev/null; wait' EXIT\n" + script
            t0 = time.monotonic()
            try:
                p = subprocess.run(["bash", "-c", wrapped], cwd=tmp, env=env,
                                   capture_output=True, text=True, timeout=300)
            finally:
                done.set()
                reader.join()
                notify.close()
            took = time.monotonic() - t0
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertTrue(p.stdout.startswith("Once upon a time"), p.stdout)
            self.assertGreater(len(p.stdout), len("Once upon a time"))
            self.assertIn("sinkd: loading %s: layer " % model, p.stderr)
            self.assertIn("of 22 (", p.stderr)
            self.assertIn("sinkd: model loaded in ", p.stderr)
            status = [m for m in msgs if m.startswith("STATUS=loading %s: layer " % model)]
            self.assertTrue(status, msgs)
            self.assertTrue(any("READY=1" in m for m in msgs), msgs)
            # the loading lines come before READY=1
            self.assertLess(msgs.index(status[0]),
                            next(i for i, m in enumerate(msgs) if "READY=1" in m))
            print("figures: README by-hand steps, 1B Q4_0: %.1f s (model made apart)" % took)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
