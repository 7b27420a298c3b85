#!/bin/sh
# The scripts a new user runs install only what they need:
# scripts/deps.sh lists what building and running take, --python what
# the Python client's install takes, --tests adds the test toolchain; run-demo.sh installs the first only and builds without
# the test suite; run-tests.sh installs both. build.sh and run-tests.sh
# build with warnings as errors, meson.build leaves them warnings.
#   test-scripts.sh SOURCE_ROOT
set -u
src=$1
status=0
fail() { echo "FAIL: $*" >&2; status=1; }
build=$("$src/scripts/deps.sh" --list) || fail "deps.sh --list"
all=$("$src/scripts/deps.sh" --tests --list) || fail "deps.sh --tests --list"
for p in meson ninja-build libuv1-dev libmsgpack-dev libsystemd-dev \
         libinih-dev libxxhash-dev libpcre2-dev libjansson-dev libhttp-parser-dev; do
  echo "$build" | grep -qx "$p" || fail "deps.sh lacks $p, which building needs"
done
for p in clang llvm valgrind gnuplot-nox libcmocka-dev curl mandoc systemd; do
  echo "$build" | grep -qx "$p" && fail "deps.sh installs $p, which only the tests need"
  echo "$all" | grep -qx "$p" || fail "deps.sh --tests lacks $p"
done
for p in $build; do
  echo "$all" | grep -qx "$p" || fail "deps.sh --tests lacks $p of the build list"
done
# --python: what the README's Python install takes, all of it in --tests
py=$("$src/scripts/deps.sh" --python --list) || fail "deps.sh --python --list"
for p in python3-venv python3-msgpack flit; do
  echo "$py" | grep -qx "$p" || fail "deps.sh --python lacks $p"
  echo "$all" | grep -qx "$p" || fail "deps.sh --tests lacks $p"
done
pk=$("$src/scripts/deps.sh" --packages --list) || fail "deps.sh --packages --list"
for p in dpkg-dev lintian man-db python3-msgpack; do
  echo "$pk" | grep -qx "$p" || fail "deps.sh --packages lacks $p (scripts/test-packages.sh)"
done
"$src/scripts/deps.sh" --bogus 2>/dev/null && fail "deps.sh accepts --bogus"
grep -qx '\./scripts/deps\.sh' "$src/scripts/run-demo.sh" || fail "run-demo.sh: not plain deps.sh"
grep -q 'build\.sh -Dtests=false' "$src/scripts/run-demo.sh" || fail "run-demo.sh builds the tests"
grep -qx '\./scripts/deps\.sh --tests' "$src/scripts/run-tests.sh" || fail "run-tests.sh: not deps.sh --tests"
# The project's own builds treat warnings as errors; meson's default does not.
grep -q -- '-Dwerror=true' "$src/scripts/build.sh" || fail "build.sh: warnings are not errors"
grep -q -- '--buildtype=release -Dwerror=true' "$src/scripts/run-tests.sh" ||
  fail "run-tests.sh: no release build with warnings as errors"
grep -q "werror=true" "$src/meson.build" && fail "meson.build: werror is a default"
[ $status -eq 0 ] && echo "ok: build list $(echo "$build" | wc -l) packages, with tests $(echo "$all" | wc -l)"
exit $status
