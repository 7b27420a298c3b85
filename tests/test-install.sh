#!/usr/bin/env bash
# `meson install` into a temporary DESTDIR, then everything a packager and
# a user rely on: the files are where they belong, libsinkd exports
# exactly its headers' functions, a program builds against the installed
# pkg-config file and talks to the installed daemon, the example
# configuration is valid, the units pass `systemd-analyze verify` (with
# their man pages found), and sysusers.d/tmpfiles.d entries apply.
# The paths come from meson (tests/meson.build): MESON, BUILD, SRC, CC,
# PKG_CONFIG, PREFIX, BINDIR, SBINDIR, LIBDIR, INCLUDEDIR, MANDIR,
# SYSCONFDIR, SYSTEM_UNIT_DIR, USER_UNIT_DIR, SYSUSERS_DIR, TMPFILES_DIR,
# COMPLETION_DIR, HAVE_MAN (0 when built without scdoc), SK_MODEL.
set -euo pipefail
# meson test points LD_LIBRARY_PATH at the build tree; the installed
# programs must find the installed library (set below where needed).
unset LD_LIBRARY_PATH
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
daemon=
cleanup() {
  [[ -n $daemon ]] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
dest=$tmp/dest

"$MESON" install -C "$BUILD" --destdir "$dest" --no-rebuild --quiet >/dev/null \
  || fail "meson install"
echo "ok: meson install --destdir"

# ---- the files
for f in "$SBINDIR/sinkd" "$BINDIR/sinkctl" \
         "$LIBDIR/libsinkd.so" "$LIBDIR/libsinkd.so.0" "$LIBDIR/pkgconfig/libsinkd.pc" \
         "$INCLUDEDIR/sinkd/client.h" "$INCLUDEDIR/sinkd/protocol.h" \
         "$SYSTEM_UNIT_DIR/sinkd.service" "$SYSTEM_UNIT_DIR/sinkd.socket" \
         "$USER_UNIT_DIR/sinkd.service" "$USER_UNIT_DIR/sinkd.socket" \
         "$SYSTEM_UNIT_DIR/sinkd-http.socket" "$USER_UNIT_DIR/sinkd-http.socket" \
         "$SYSUSERS_DIR/sinkd.conf" "$TMPFILES_DIR/sinkd.conf" \
         "$SYSCONFDIR/sinkd/sinkd.conf" \
         "$COMPLETION_DIR/sinkctl" "$COMPLETION_DIR/sinkd"; do
  [[ -e $dest$f ]] || fail "not installed: $f"
done
man=no
if [[ $HAVE_MAN == 1 ]]; then
  man=yes
  for f in man1/sinkctl.1 man3/libsinkd.3 man5/sinkd.conf.5 man7/sinkd-protocol.7 man8/sinkd.8; do
    [[ -e $dest$MANDIR/$f ]] || fail "not installed: $MANDIR/$f"
  done
fi
[[ -x $dest$SBINDIR/sinkd && -x $dest$BINDIR/sinkctl ]] || fail "binaries not executable"
grep -q "^ExecStart=$SBINDIR/sinkd\$" "$dest$SYSTEM_UNIT_DIR/sinkd.service" \
  || fail "sinkd.service does not start $SBINDIR/sinkd"
echo "ok: installed files"

# ---- exports = the functions the public headers declare
declared=$(grep -ohE '\bsk_[a-z0-9_]+\(' "$dest$INCLUDEDIR"/sinkd/*.h | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$dest$LIBDIR/libsinkd.so" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort -u)
if [[ $declared != "$exported" ]]; then
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  fail "libsinkd exports differ from the headers (< declared, > exported)"
fi
nm -D --defined-only "$dest$LIBDIR/libsinkd.so" | grep -q ' sk_client_connect@@LIBSINKD_0$' \
  || fail "sk_client_connect is not versioned LIBSINKD_0"
echo "ok: libsinkd exports $(wc -l <<< "$exported") functions, all declared"

# ---- a program built against the installed pkg-config file
export PKG_CONFIG_PATH=$dest$LIBDIR/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
[[ $("$PKG_CONFIG" --modversion libsinkd) == 0.1.0 ]] || fail "pkg-config --modversion"
cflags=$("$PKG_CONFIG" --cflags libsinkd)
libs=$("$PKG_CONFIG" --libs libsinkd)
[[ $cflags == *"-I$dest$INCLUDEDIR"* ]] || fail "cflags '$cflags' do not point into the install"
# shellcheck disable=SC2086
$CC -std=c11 -Wall -Wextra -Werror -pedantic ${SANITIZE_FLAGS:-} $cflags -o "$tmp/install-check" \
  "$SRC/tests/install-check.c" $libs || fail "building against the installed library"
echo "ok: built with $cflags $libs"

sock=$tmp/s.sock
LD_LIBRARY_PATH=$dest$LIBDIR "$dest$SBINDIR/sinkd" --config /dev/null --model "$SK_MODEL" \
  --socket "$sock" --state-dir "$tmp/state" --threads 1 2>"$tmp/sinkd.log" &
daemon=$!
for _ in $(seq 500); do
  LD_LIBRARY_PATH=$dest$LIBDIR "$dest$BINDIR/sinkctl" --socket "$sock" ping >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || { cat "$tmp/sinkd.log" >&2; fail "installed sinkd died"; }
  sleep 0.02
done
out=$(LD_LIBRARY_PATH=$dest$LIBDIR "$tmp/install-check" "$sock") || fail "install-check: $out"
[[ $(LD_LIBRARY_PATH=$dest$LIBDIR ldd "$tmp/install-check") == *"$dest$LIBDIR/libsinkd.so.0"* ]] \
  || fail "install-check did not load the installed libsinkd"
expected="protocol 1, server sinkd, vocab 512
session dense 64"
[[ $out == "$expected"* ]] || fail "install-check printed: $out"
[[ $out == *"stop length, 8 tokens"* ]] || fail "install-check printed: $out"
[[ $out == *"no_such_session: no such session"* ]] || fail "install-check printed: $out"
[[ $out == *"frame header 13" ]] || fail "install-check printed: $out"
kill "$daemon"; wait "$daemon" || fail "installed sinkd did not stop cleanly"
daemon=
echo "ok: the program talks to the installed daemon"

# ---- the example configuration is valid (its model path overridden)
"$dest$SBINDIR/sinkd" --config "$dest$SYSCONFDIR/sinkd/sinkd.conf" --model "$SK_MODEL" \
  --check-config >"$tmp/effective.conf" || fail "the installed sinkd.conf does not check"
grep -q "^max_sessions = 64 ; default$" "$tmp/effective.conf" || fail "check-config output"
grep -q "^model = /var/lib/sinkd/model.gguf" "$dest$SYSCONFDIR/sinkd/sinkd.conf" \
  || fail "the example configuration names no model"
echo "ok: example configuration"

# ---- units: systemd-analyze verify, man pages looked up in the install
command -v systemd-analyze >/dev/null || fail "systemd-analyze not found (Debian package systemd; scripts/deps.sh --tests)"
mkdir -p "$tmp/system" "$tmp/user" "$tmp/runtime"
chmod 700 "$tmp/runtime"
for unit in sinkd.service sinkd.socket sinkd-http.socket; do
  # ExecStart= must name an existing file: the installed one.
  sed "s|^ExecStart=$SBINDIR/|ExecStart=$dest$SBINDIR/|" "$dest$SYSTEM_UNIT_DIR/$unit" > "$tmp/system/$unit"
  sed "s|^ExecStart=$SBINDIR/|ExecStart=$dest$SBINDIR/|" "$dest$USER_UNIT_DIR/$unit" > "$tmp/user/$unit"
done
MANPATH=$dest$MANDIR systemd-analyze verify --man=$man "$tmp/system/sinkd.service" "$tmp/system/sinkd.socket" \
  "$tmp/system/sinkd-http.socket" \
  >"$tmp/verify.log" 2>&1 || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify (system units)"; }
[[ ! -s $tmp/verify.log ]] || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify had remarks"; }
XDG_RUNTIME_DIR=$tmp/runtime MANPATH=$dest$MANDIR systemd-analyze --user verify --man=$man \
  "$tmp/user/sinkd.service" "$tmp/user/sinkd.socket" "$tmp/user/sinkd-http.socket" \
  >"$tmp/verify.log" 2>&1 \
  || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify (user units)"; }
[[ ! -s $tmp/verify.log ]] || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify had remarks"; }
# The check is real: a typo gets a remark.
sed 's/^ProtectSystem=strict/ProtectSystm=strict/' "$tmp/system/sinkd.service" > "$tmp/system/bad.service"
systemd-analyze verify --man=no "$tmp/system/bad.service" 2>&1 | grep -q ProtectSystm \
  || fail "systemd-analyze verify does not notice a typo"
grep -q '^Type=notify$' "$tmp/system/sinkd.service" || fail "sinkd.service is not Type=notify"
grep -q '^ListenStream=/run/sinkd/sinkd.sock$' "$tmp/system/sinkd.socket" || fail "sinkd.socket path"
echo "ok: systemd-analyze verify (system and user units, man pages found)"

# ---- sysusers.d and tmpfiles.d entries apply to an empty root
root=$tmp/root
mkdir -p "$root/etc"
systemd-sysusers --root="$root" "$dest$SYSUSERS_DIR/sinkd.conf" >/dev/null 2>&1 \
  || fail "systemd-sysusers"
grep -q '^sinkd:x:[0-9]*:[0-9]*:sinkd LLM session daemon:/var/lib/sinkd:' "$root/etc/passwd" \
  || fail "sysusers did not create user sinkd"
grep -q '^sinkd:x:' "$root/etc/group" || fail "sysusers did not create group sinkd"
if [[ $(id -u) == 0 ]]; then
  systemd-tmpfiles --root="$root" --create "$dest$TMPFILES_DIR/sinkd.conf" || fail "systemd-tmpfiles"
  [[ $(stat -c %a "$root/var/lib/sinkd") == 750 ]] || fail "tmpfiles: /var/lib/sinkd mode"
fi
echo "ok: sysusers.d and tmpfiles.d"
