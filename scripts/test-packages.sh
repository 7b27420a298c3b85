#!/usr/bin/env bash
# The Debian packages (debian/), as a user gets them:
#   1. built with dpkg-buildpackage from the committed tree (git archive
#      HEAD) in a temporary folder, so that nothing lands in the checkout
#      or beside it; lintian finds no error and no warning;
#   2. installed on this machine with apt: the user sinkd, /var/lib/sinkd,
#      the units enabled, the conffile; sinkd --version, sinkctl --help,
#      the man pages, bash completion, systemd-analyze verify on the
#      installed units, a client built with pkg-config, the Python client
#      with Debian's /usr/bin/python3;
#   3. the installed daemon started as the unit starts it (user sinkd, no
#      arguments, the installed sinkd.conf): with no model yet it says so
#      and waits; once the model is at the configured path and it gets
#      SIGHUP, it serves ../shared/models/stories260K.gguf, and the
#      installed sinkctl's greedy continuation is llama.cpp's reference;
#   4. purged: the files under /etc, /usr, /var, /opt, /srv and /run/sinkd,
#      the users and groups, and the installed packages are as before.
# /run/sinkd or /var/lib/sinkd found with no package installed (a sinkd
# run by hand as root) is set aside for the test and put back after; one
# that a process uses fails the test before anything is installed.
# Installs and purges the packages sinkd, sinkctl, libsinkd0, libsinkd-dev
# and python3-sinkd (purging them first if an earlier run left them), so
# it needs root; PID 1 need not be systemd. .ci/run runs it after the
# test suite. The shared material is read from ../shared beside the
# checkout unless SK_SHARED_DIR names another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
# Debian's own programs (/usr/bin/python3, not one earlier on PATH).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8
# man pages formatted 80 columns wide (by man, or by systemd-analyze
# verify --man looking them up) are kept in /var/cache/man, where they
# would outlive the packages; at any other width they are not.
export MANWIDTH=100
unset PYTHONPATH PYTHONHOME SINKD_SOCKET
fail() { echo "FAIL: $*" >&2; exit 1; }
n_ok=0
ok() { n_ok=$((n_ok + 1)); echo "ok: $*"; }
[[ $(id -u) == 0 ]] || { echo "test-packages.sh: needs root (apt-get install and purge)" >&2; exit 2; }
shared=${SK_SHARED_DIR:-$top/../shared}
model=$shared/models/stories260K.gguf
reference=$shared/reference/stories260K/greedy.json
[[ -r $model && -r $reference ]] || fail "no $model or $reference (SK_SHARED_DIR)"
pkgs=(sinkd sinkctl libsinkd0 libsinkd-dev python3-sinkd)
apt_opts=(-y -q -o DPkg::Lock::Timeout=600)
export DEBIAN_FRONTEND=noninteractive

./scripts/deps.sh --packages
tmp=$(mktemp -d /tmp/sinkd-packages.XXXXXX)
chmod 755 "$tmp" # user sinkd reaches the notify socket in it
daemon='' listener=''
installed() { # those of pkgs that dpkg knows (installed, or configuration left)
  { dpkg-query -W -f='${Package} ${Status}\n' "${pkgs[@]}" 2>/dev/null || true; } |
    awk '$NF != "not-installed" { print $1 }'
}
# The folders the package owns and its purge removes. One that is there
# with no package installed (a sinkd run by hand as root makes
# /run/sinkd) is set aside beside itself for the test and put back after.
owned=(/run/sinkd /var/lib/sinkd)
aside=()
cleanup() {
  set +e
  [[ -n $daemon ]] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  [[ -n $listener ]] && kill "$listener" 2>/dev/null && wait "$listener" 2>/dev/null
  local left d
  left=$(installed)
  # shellcheck disable=SC2086
  [[ -z $left ]] || apt-get purge "${apt_opts[@]}" $left >/dev/null 2>&1 || true
  for d in "${aside[@]}"; do
    rm -rf "$d" && mv "$d.test-packages-aside" "$d" && echo "note: $d put back" >&2
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
left=$(installed)
if [[ -n $left ]]; then
  echo "note: purging $(xargs <<<"$left") left by an earlier run" >&2
  # shellcheck disable=SC2086
  apt-get purge "${apt_opts[@]}" $left >/dev/null
fi
in_use() { # DIR: a process has a file in it open, or listens on a socket in it
  local fd
  for fd in /proc/[0-9]*/fd/*; do
    [[ $(readlink "$fd" 2>/dev/null) == "$1"/* ]] && return 0
  done
  command -v ss >/dev/null && ss -xlH 2>/dev/null | grep -qF " $1/" && return 0
  return 1
}
for d in "${owned[@]}"; do
  [[ -e $d ]] || continue
  in_use "$d" && fail "$d is in use (a sinkd started by hand?): purging the test's packages would remove it; stop that daemon first"
  [[ ! -e $d.test-packages-aside ]] || fail "$d and $d.test-packages-aside are both there: an earlier run was killed; put back or remove one"
  mv "$d" "$d.test-packages-aside"
  aside+=("$d")
  echo "note: $d was there with no package installed: set aside as $d.test-packages-aside until the end" >&2
done

# ---- 1. build from the committed tree, lintian
version=$(sed -n "s/^  version : '\(.*\)',$/\1/p" meson.build)
changelog_version=$(dpkg-parsechangelog -l debian/changelog -S Version)
[[ $changelog_version == "$version" ]] ||
  fail "debian/changelog is at $changelog_version, meson.build at $version"
git_before=$(git status --porcelain)
parent_before=$(ls -A ..)
src=$tmp/sinkd-$version
mkdir "$src"
git archive --format=tar HEAD | tar -x -C "$src"
apt-get build-dep "${apt_opts[@]}" "$src" >"$tmp/build-dep.log" 2>&1 ||
  { cat "$tmp/build-dep.log" >&2; fail "apt-get build-dep"; }
t0=$(date +%s)
# DPKG_GENSYMBOLS_CHECK_LEVEL=4: a symbol libsinkd gains or loses that
# debian/libsinkd0.symbols does not list fails the build.
(cd "$src" && DPKG_GENSYMBOLS_CHECK_LEVEL=4 nice dpkg-buildpackage -us -uc -b) \
  >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log" >&2; fail "dpkg-buildpackage"; }
t1=$(date +%s)
debs=()
for p in "${pkgs[@]}"; do
  f=$(ls "$tmp/${p}_${version}_"*.deb 2>/dev/null) || fail "no package $p built"
  debs+=("$f")
done
ok "dpkg-buildpackage -us -uc -b built ${pkgs[*]} $version ($((t1 - t0)) s)"
lintian --fail-on error,warning --display-info --show-overrides \
  "$tmp/sinkd_${version}_"*.changes >"$tmp/lintian.log" 2>&1 ||
  { cat "$tmp/lintian.log" >&2; fail "lintian"; }
grep -v '^running with root privileges' "$tmp/lintian.log" | sed 's/^/  lintian: /' || true
summary=$(awk -F: '/^[EWIPXO]: / { n[$1]++ } END { printf "%d errors, %d warnings, %d info, %d overridden",
  n["E"], n["W"], n["I"], n["O"] }' "$tmp/lintian.log")
ok "lintian --display-info: $summary ($(($(date +%s) - t1)) s)"
for f in "${debs[@]}"; do
  printf '  %-34s %8d bytes, %5d KiB installed\n' "${f##*/}" "$(stat -c %s "$f")" \
    "$(dpkg-deb -f "$f" Installed-Size)"
done
if [[ $(git status --porcelain) != "$git_before" || $(ls -A ..) != "$parent_before" ]]; then
  diff <(echo "$git_before") <(git status --porcelain) >&2 || true
  diff <(echo "$parent_before") <(ls -A ..) >&2 || true
  fail "the checkout (git status) or its parent folder changed during the build"
fi
ok "the checkout and its parent folder are as they were"

# ---- the machine before
snapshot() {
  find /etc /usr /var /opt /srv -xdev \( -path /var/log -o -path /var/cache/apt -o \
    -path /var/lib/apt/lists -o -path /var/tmp \) -prune -o -print | sort >"$1.files"
  find /run/sinkd >>"$1.files" 2>/dev/null || true
  getent passwd | sort >"$1.users"
  getent group | sort >"$1.groups"
  dpkg-query -W -f='${Package} ${Version} ${Status}\n' | sort >"$1.packages"
}
# man-db's own runs add CACHEDIR.TAG files to its cache: settled first, so
# that only the packages' changes show.
mandb --quiet
snapshot "$tmp/before"

# ---- 2. install
t2=$(date +%s)
apt-get install "${apt_opts[@]}" "${debs[@]}" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "apt-get install"; }
dpkg-query -W -f='${Package} ${Version} ${Status}\n' | sort >"$tmp/installed.packages"
new=$(comm -13 "$tmp/before.packages" "$tmp/installed.packages" | awk '{print $1}' | sort | xargs)
[[ $new == "$(printf '%s\n' "${pkgs[@]}" | sort | xargs)" ]] ||
  fail "apt installed '$new', not just the packages (scripts/deps.sh --packages lacks a dependency?)"
ok "apt-get install ${debs[*]##*/}"

IFS=: read -r _ _ uid _ _ home shell < <(getent passwd sinkd) || fail "no user sinkd"
if (( uid >= 1000 )) || [[ $home != /var/lib/sinkd || $shell != */nologin ]]; then
  fail "user sinkd: uid $uid, home $home, shell $shell"
fi
getent group sinkd >/dev/null || fail "no group sinkd"
[[ $(stat -c '%a %U %G' /var/lib/sinkd) == "750 sinkd sinkd" ]] ||
  fail "/var/lib/sinkd is $(stat -c '%a %U %G' /var/lib/sinkd)"
for link in multi-user.target.wants/sinkd.service sockets.target.wants/sinkd.socket \
            sockets.target.wants/sinkd-http.socket; do
  [[ -L /etc/systemd/system/$link ]] || fail "not enabled: $link"
done
[[ ! -e /etc/systemd/user/sockets.target.wants/sinkd.socket ]] ||
  fail "the per-user units are enabled for every user"
dpkg-query -W -f='${Conffiles}\n' sinkd | grep -q '^ /etc/sinkd/sinkd.conf ' ||
  fail "/etc/sinkd/sinkd.conf is not a conffile"
ok "user sinkd (uid $uid, $shell), /var/lib/sinkd 0750, units enabled, sinkd.conf a conffile"

[[ $(sinkd --version) == "sinkd $version" ]] || fail "sinkd --version: $(sinkd --version)"
sinkctl --help | grep -q '^Usage: sinkctl' || fail "sinkctl --help"
ok "$(command -v sinkd) --version: sinkd $version; $(command -v sinkctl) --help"
for page in 8:sinkd 5:sinkd.conf 1:sinkctl 3:libsinkd 7:sinkd-protocol 7:sinkd-http; do
  out=$(man --warnings -P cat "${page%%:*}" "${page#*:}" 2>"$tmp/man.err") ||
    fail "man ${page%%:*} ${page#*:}"
  [[ ! -s $tmp/man.err ]] || { cat "$tmp/man.err" >&2; fail "man ${page#*:}: warnings"; }
  grep -q "^ *${page#*:} - " <<<"$out" || fail "man ${page#*:}: no NAME line"
done
ok "man sinkd, sinkd.conf, sinkctl, libsinkd, sinkd-protocol, sinkd-http render"
# shellcheck disable=SC1091
bash -c 'source /usr/share/bash-completion/completions/sinkctl &&
  source /usr/share/bash-completion/completions/sinkd && complete -p sinkctl sinkd' >/dev/null ||
  fail "bash completion"
ok "bash completion for sinkctl and sinkd"

systemd-analyze verify --man=yes /lib/systemd/system/sinkd.service /lib/systemd/system/sinkd.socket \
  /lib/systemd/system/sinkd-http.socket >"$tmp/verify.log" 2>&1 ||
  { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify (system units)"; }
[[ ! -s $tmp/verify.log ]] || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify had remarks"; }
mkdir -m 700 "$tmp/runtime"
XDG_RUNTIME_DIR=$tmp/runtime systemd-analyze --user verify --man=yes \
  /usr/lib/systemd/user/sinkd.service /usr/lib/systemd/user/sinkd.socket \
  /usr/lib/systemd/user/sinkd-http.socket >"$tmp/verify.log" 2>&1 ||
  { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify (user units)"; }
[[ ! -s $tmp/verify.log ]] || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify had remarks"; }
ok "systemd-analyze verify: the installed system and user units"

# A client built with the installed pkg-config file, headers and library.
cflags=$(pkg-config --cflags libsinkd) libs=$(pkg-config --libs libsinkd)
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror -pedantic $cflags -o "$tmp/install-check" \
  "$src/tests/install-check.c" $libs || fail "building a client with pkg-config libsinkd"
[[ $(ldd "$tmp/install-check") == *"/lib/x86_64-linux-gnu/libsinkd.so.0 "* ]] ||
  fail "the client does not load the installed libsinkd.so.0"
ok "cc \$(pkg-config --cflags --libs libsinkd) ($cflags$libs) builds and links a client"

# ---- 3. the daemon as sinkd.service runs it, without systemd: a
# NOTIFY_SOCKET listener of ours, /run/sinkd as RuntimeDirectory= makes it.
cat >"$tmp/listen.py" <<'PY'
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
with open(sys.argv[2], "a") as f:
    while True:
        f.write(s.recv(4096).decode().replace("\n", " | ") + "\n")
        f.flush()
PY
/usr/bin/python3 "$tmp/listen.py" "$tmp/notify" "$tmp/notify.log" &
listener=$!
for _ in $(seq 200); do [[ -S $tmp/notify ]] && break; sleep 0.05; done
install -d -o sinkd -g sinkd -m 0755 /run/sinkd
wait_notify() { # PATTERN: a notification matching it, within 60 s
  for _ in $(seq 1200); do
    grep -q "$1" "$tmp/notify.log" 2>/dev/null && return 0
    kill -0 "$daemon" 2>/dev/null || { cat "$tmp/sinkd.log" >&2; fail "the installed sinkd died"; }
    sleep 0.05
  done
  cat "$tmp/sinkd.log" "$tmp/notify.log" >&2
  fail "no notification matching '$1'"
}
[[ ! -e /var/lib/sinkd/model.gguf ]] || fail "/var/lib/sinkd/model.gguf is there before the test"
env -i NOTIFY_SOCKET="$tmp/notify" /usr/bin/setpriv --reuid=sinkd --regid=sinkd --init-groups \
  /usr/sbin/sinkd 2>"$tmp/sinkd.log" &
daemon=$!
want="READY=1 | STATUS=no model: /var/lib/sinkd/model.gguf does not exist; put the GGUF file there or set model = in /etc/sinkd/sinkd.conf, then systemctl reload sinkd"
wait_notify "^READY=1 | STATUS=no model"
grep -qxF "$want" "$tmp/notify.log" || { cat "$tmp/notify.log" >&2; fail "status while waiting"; }
ok "no model yet: the installed sinkd is up and waits (STATUS=no model: ...)"
install -m 0644 "$model" /var/lib/sinkd/model.gguf
kill -HUP "$daemon"
wait_notify "^STATUS=serving "
grep -q "^READY=1$" "$tmp/notify.log" || fail "no READY=1 once serving"
ok "model put at /var/lib/sinkd/model.gguf, SIGHUP: sinkd loads it and serves"

out=$(sinkctl generate --temperature 0 --max-tokens 64 "Once upon a time") || fail "sinkctl generate"
expected=$(/usr/bin/python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))["prompts"][0]
assert p["prompt"] == "Once upon a time"
print(p["prompt"] + p["generated_text"])' "$reference")
[[ $out == "$expected" ]] || fail "sinkctl generate printed '$out', llama.cpp's reference is '$expected'"
ok "sinkctl generate: 64 greedy tokens of stories260K, as llama.cpp's reference"

out=$("$tmp/install-check" /run/sinkd/sinkd.sock) || fail "the pkg-config client: $out"
[[ $out == "protocol 1, server sinkd, vocab 512
session dense 64"* && $out == *"stop length, 8 tokens"* && $out == *"frame header 13" ]] ||
  fail "the pkg-config client printed: $out"
ok "the client built with pkg-config talks to the installed daemon"

out=$(cd "$tmp" && /usr/bin/python3 -c 'import json, sinkd, sys
c = sinkd.Client()
h = c.hello()
ids = c.tokenize("Once upon a time", bos=True)
ref = json.load(open(sys.argv[1]))["prompts"][0]["prompt_ids"]
print(sinkd.__file__, h["server"], ids == ref)' "$reference") || fail "python3: $out"
[[ $out == "/usr/lib/python3/dist-packages/sinkd/__init__.py sinkd True" ]] ||
  fail "/usr/bin/python3 -c 'import sinkd': $out"
ok "/usr/bin/python3 -c 'import sinkd': hello, tokenize as llama.cpp ($out)"

kill -TERM "$daemon"
wait "$daemon" || fail "the installed sinkd did not stop cleanly"
daemon=
grep -q "^STOPPING=1" "$tmp/notify.log" || fail "no STOPPING=1"
kill "$listener"
wait "$listener" 2>/dev/null || true
listener=
ok "SIGTERM: STOPPING=1, exit 0"

# ---- 4. purge: the machine as before
t3=$(date +%s)
apt-get purge "${apt_opts[@]}" "${pkgs[@]}" >"$tmp/purge.log" 2>&1 ||
  { cat "$tmp/purge.log" >&2; fail "apt-get purge"; }
[[ -z $(installed) ]] || fail "still installed after purge: $(installed)"
snapshot "$tmp/after"
for what in files users groups packages; do
  if ! diff -u "$tmp/before.$what" "$tmp/after.$what" >"$tmp/diff.$what"; then
    cat "$tmp/diff.$what" >&2
    fail "purge left the $what changed (- before, + after)"
  fi
done
ok "apt-get purge: files ($(wc -l <"$tmp/before.files") under /etc /usr /var /opt /srv), users, groups and packages as before"
echo "packages: install, checks and purge took $(($(date +%s) - t2)) s (purge and comparison $(($(date +%s) - t3)) s)" >&2
echo "packages: $n_ok passed, 0 failed"
