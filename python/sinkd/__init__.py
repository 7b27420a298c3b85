"""Client for sinkd, the LLM session daemon, over its msgpack protocol.

The wire format is sinkd-protocol(7): 4-byte big-endian length frames,
each one msgpack map. A Client is one connection; sessions it opens
outlive it (unless opened temporary=True).

    from sinkd import Client
    with Client() as c:
        s = c.open(policy="streaming", n_sink=4, window=1020)
        c.append(s, "Once upon a time")
        for text in c.generate(s, max_tokens=32, temperature=0):
            print(text, end="")

Every failure the daemon reports raises a subclass of SinkdError whose
.code is the protocol's error code ("busy", "forbidden", ...).
"""

import errno as _errno
import os
import socket as _socket
import struct
import time as _time

import msgpack

__all__ = [
    "Client", "SinkdError", "BadRequest", "UnknownOp", "NoSuchSession",
    "Forbidden", "ContextFull", "Busy", "TooLarge", "Cancelled", "BadModel",
    "NoMemory", "Internal", "IOError_", "ConnectError", "Disconnected",
    "ProtocolError", "default_socket",
]

# Replies and events up to the protocol's ceiling (16 MiB).
FRAME_MAX = 16 << 20


class SinkdError(Exception):
    """An error reply of the daemon, or a failure of the connection."""

    code = "internal"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self):
        return "%s: %s" % (self.code, self.message)


class BadRequest(SinkdError):
    code = "bad_request"


class UnknownOp(SinkdError):
    code = "unknown_op"


class NoSuchSession(SinkdError):
    code = "no_such_session"


class Forbidden(SinkdError):
    code = "forbidden"


class ContextFull(SinkdError):
    code = "context_full"


class Busy(SinkdError):
    code = "busy"


class TooLarge(SinkdError):
    code = "too_large"


class Cancelled(SinkdError):
    code = "cancelled"


class BadModel(SinkdError):
    code = "bad_model"


class NoMemory(SinkdError):
    code = "no_memory"


class Internal(SinkdError):
    code = "internal"


class IOError_(SinkdError):
    """A system call failed (connect, read, write)."""
    code = "io"


class ConnectError(IOError_, OSError):
    """The daemon's socket could not be connected to (no daemon there, no
    permission, ...). An OSError too: .errno and .filename say which."""
    code = "io"

    def __init__(self, message, err=None, path=None):
        IOError_.__init__(self, message)
        self.errno = err
        self.strerror = os.strerror(err) if err else None
        self.filename = path

    def __str__(self):
        return SinkdError.__str__(self)


class Disconnected(SinkdError):
    """The daemon closed the connection."""
    code = "disconnected"


class ProtocolError(SinkdError):
    """The daemon sent something this client cannot read."""
    code = "protocol"


_BY_CODE = {cls.code: cls for cls in (
    BadRequest, UnknownOp, NoSuchSession, Forbidden, ContextFull, Busy,
    TooLarge, Cancelled, BadModel, NoMemory, Internal, IOError_,
    Disconnected, ProtocolError)}


def _error(code, message):
    return _BY_CODE.get(code, SinkdError)(message, code)


def default_socket():
    """The socket libsinkd would use: $SINKD_SOCKET, else the per-user
    daemon's ($XDG_RUNTIME_DIR/sinkd/sinkd.sock) when it exists, else the
    system one (/run/sinkd/sinkd.sock)."""
    env = os.environ.get("SINKD_SOCKET")
    if env:
        return env
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        path = os.path.join(xdg, "sinkd", "sinkd.sock")
        if os.path.exists(path):
            return path
    return "/run/sinkd/sinkd.sock"


# connect() errors that a daemon still starting gives: no socket yet, or
# one not listening yet.
_NOT_YET = (_errno.ENOENT, _errno.ECONNREFUSED)


class Client:
    """One connection to sinkd. Not thread-safe: use one per thread.

    timeout: seconds for each read and write (None: no limit). wait:
    seconds to wait for a daemon that is starting (its socket not there
    yet, or not listening yet, or the model still loading) before giving
    up with ConnectError; None or 0: no waiting."""

    def __init__(self, socket=None, timeout=None, wait=None):
        self.path = socket or default_socket()
        self._next_id = 0
        self._buf = bytearray()
        self._early = {}  # frames of other requests read while waiting
        deadline = _time.monotonic() + wait if wait else None
        while True:
            self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                self._sock.settimeout(timeout)
                self._sock.connect(self.path)
                break
            except OSError as e:
                self._sock.close()
                if (deadline is not None and e.errno in _NOT_YET
                        and _time.monotonic() < deadline):
                    _time.sleep(0.05)
                    continue
                raise ConnectError("cannot connect to %s: %s (is sinkd running?%s)"
                                   % (self.path, e.strerror or e,
                                      " waited %gs" % wait if wait else ""),
                                   e.errno, self.path) from None
        if deadline is not None:
            # Ready once it answers: a service manager's socket accepts
            # before the daemon behind it has loaded its model.
            self._sock.settimeout(max(deadline - _time.monotonic(), 0.001))
            try:
                self.ping()
            except (IOError_, Disconnected) as e:
                self._sock.close()
                raise ConnectError("%s did not answer within %gs: %s"
                                   % (self.path, wait, e.message),
                                   _errno.ETIMEDOUT, self.path) from None
            self._sock.settimeout(timeout)

    # ---- framing ----

    def _send(self, op, fields):
        self._next_id += 1
        msg = {"id": self._next_id, "op": op}
        msg.update({k: v for k, v in fields.items() if v is not None})
        body = msgpack.packb(msg, use_bin_type=True)
        try:
            self._sock.sendall(struct.pack(">I", len(body)) + body)
        except OSError as e:
            raise IOError_("write to %s: %s" % (self.path, e)) from None
        return self._next_id

    def _read_frame(self):
        while True:
            if len(self._buf) >= 4:
                n = struct.unpack(">I", self._buf[:4])[0]
                if n == 0 or n > FRAME_MAX:
                    raise ProtocolError("frame of %d bytes from the daemon" % n)
                if len(self._buf) >= 4 + n:
                    body = bytes(self._buf[4:4 + n])
                    del self._buf[:4 + n]
                    try:
                        msg = msgpack.unpackb(body, raw=False, strict_map_key=False)
                    except Exception as e:
                        raise ProtocolError("unreadable frame: %s" % e) from None
                    if not isinstance(msg, dict):
                        raise ProtocolError("frame is not a map")
                    return msg
            try:
                chunk = self._sock.recv(65536)
            except OSError as e:
                raise IOError_("read from %s: %s" % (self.path, e)) from None
            if not chunk:
                raise Disconnected("the daemon closed the connection")
            self._buf += chunk

    def _next(self, req_id):
        """The next frame (event or reply) of request req_id."""
        queue = self._early.get(req_id)
        if queue:
            return queue.pop(0)
        while True:
            msg = self._read_frame()
            mid = msg.get("id", 0)
            if mid == req_id:
                return msg
            if mid == 0 and msg.get("ok") is False:
                self._raise(msg)
            self._early.setdefault(mid, []).append(msg)

    @staticmethod
    def _raise(msg):
        err = msg.get("error") or {}
        raise _error(err.get("code", "internal"), err.get("message", "error"))

    def _reply(self, req_id):
        while True:
            msg = self._next(req_id)
            if "event" in msg:
                continue
            if not msg.get("ok"):
                self._raise(msg)
            msg.pop("id", None)
            msg.pop("ok", None)
            return msg

    def call(self, op, **fields):
        """Any op: sends it and returns its reply's fields (a dict);
        events are skipped. Raises SinkdError on an error reply."""
        return self._reply(self._send(op, fields))

    # ---- ops ----

    def hello(self):
        return self.call("hello")

    def ping(self):
        self.call("ping")

    def open(self, policy=None, temporary=None, pin=None, **params):
        """Opens a session; returns its id. params: n_sink, window, heavy,
        recent, capacity, rope_scale, pin_tokens, and its speculative
        decoding: speculation ("off", "draft" or "lookup"), draft_tokens
        (1..15), draft_fixed (see sinkd-protocol(7))."""
        return self.call("open", policy=policy, temporary=temporary, pin=pin,
                         **params)["session"]

    def open_info(self, **fields):
        """open, returning the whole reply (capacity, kv_bytes,
        object_bytes, ...)."""
        return self.call("open", **fields)

    def close_session(self, session):
        """Closes a session (a running generate on it is cancelled)."""
        return self.call("close", session=session)

    def close(self):
        """Closes the connection (temporary sessions end with it)."""
        self._sock.close()

    def append(self, session, text=None, tokens=None, bos=None, logprobs=None):
        """Prefills text (str or bytes) or token ids; returns the reply
        (n_tokens, resident, seen, evicted, evicted_ranges, ...)."""
        return self.call("append", session=session, text=text, tokens=tokens,
                         bos=bos, logprobs=logprobs)

    def generate(self, session, max_tokens=None, temperature=None, top_k=None,
                 top_p=None, seed=None, stop=None, prompt=None,
                 ignore_eos=None, result=None, logprobs=None, top_logprobs=None,
                 events=None, speculation=None, draft_tokens=None, draft_fixed=None):
        """Generates on a session: an iterator of the streamed token texts
        (str). When it ends, the final reply (stop, n_tokens, usage,
        evicted, ...) is stored in result (a dict) if one is given. With
        logprobs=True (or top_logprobs=N, 0..20) each token event also
        carries "logprob" and "bytes" (and "top_logprobs": [token,
        logprob, bytes] triples); events (a list) receives every token
        event (a dict: token, text, ...). Leaving the loop early does not
        stop the generation: call cancel(). speculation ("off", "draft",
        "lookup"), draft_tokens and draft_fixed override the session's
        speculative decoding for this generate; usage then counts
        drafted_tokens and accepted_tokens."""
        return self._stream("generate", dict(
            session=session, max_tokens=max_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, stop=stop, prompt=prompt,
            ignore_eos=ignore_eos, logprobs=logprobs, top_logprobs=top_logprobs,
            speculation=speculation, draft_tokens=draft_tokens,
            draft_fixed=draft_fixed), result, events)

    def chat(self, session, messages, result=None, events=None, **fields):
        """The chat op: messages (a list of {"role", "content"}, only the
        ones the session has not seen) formatted with the session's chat
        template, then the assistant's reply generated: an iterator of its
        token texts, as generate. A "system" (or "developer") message
        first in an empty session's first chat is its system prompt,
        pinned as its sinks. fields: those of generate (max_tokens,
        temperature, logprobs, ...). The final reply goes into result,
        the token events into events, if given."""
        return self._stream("chat", dict(fields, session=session, messages=messages), result,
                            events)

    def _stream(self, op, fields, result, events=None):
        req = self._send(op, fields)
        while True:
            msg = self._next(req)
            if msg.get("event") == "token":
                if events is not None:
                    events.append(msg)
                yield msg.get("text", "")
                continue
            if "event" in msg:
                continue
            if not msg.get("ok"):
                self._raise(msg)
            if result is not None:
                result.update(msg)
            tail = msg.get("text", "")
            if tail:
                yield tail
            return

    def cancel(self, session):
        return self.call("cancel", session=session).get("cancelled", False)

    def stats(self, session=None, tokens=None):
        return self.call("stats", session=session, tokens=tokens)

    def list(self):
        return self.call("list")["sessions"]

    def resume(self, session):
        return self.call("resume", session=session)

    def fork(self, session):
        """Copies a session; returns the new id."""
        return self.call("fork", session=session)["session"]

    def tokenize(self, text, bos=None):
        return self.call("tokenize", text=text, bos=bos)["tokens"]

    def detokenize(self, tokens):
        return self.call("detokenize", tokens=tokens)["text"]

    def export(self, session):
        """The session's image (bytes), for import_ here or elsewhere."""
        req = self._send("export", dict(session=session))
        parts = []
        while True:
            msg = self._next(req)
            if msg.get("event") == "data":
                parts.append(msg["data"])
                continue
            if not msg.get("ok"):
                self._raise(msg)
            return b"".join(parts)

    def import_(self, image, chunk=256 * 1024):
        """Creates a session from an export image; returns its id."""
        total = len(image)
        off = 0
        while True:
            piece = image[off:off + chunk]
            reply = self.call("import", total=total, offset=off, data=bytes(piece))
            off += len(piece)
            if off >= total:
                return reply["session"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
