#!/usr/bin/env bash
# Installs the dependencies (deps.sh --tests: building, running and the
# test toolchain), builds, and runs the whole test suite (every build with
# warnings as errors):
#   1. ./build: every test (unit tests, integration, hostile frames,
#      isolation between users, GGUF mutants, fuzz corpus replays, load);
#      ./build-release: the release build a distribution makes (-O3),
#      built, not run, for the warnings only an optimizer finds;
#   2. ./build-asan (clang, ASan+UBSan, libFuzzer): the same suite again,
#      then each fuzz target for SK_FUZZ_SECONDS (default 60) seconds;
#   3. the integration tests under valgrind memcheck (no errors, no leaks,
#      in the test and in the daemon it starts);
#   4. ./build-tsan (clang, ThreadSanitizer): the tests that run the
#      daemon's threads (compute pool, event loop, thread-pool work, many
#      clients); a data race ends the daemon with TSan's exit status, which
#      the tests check;
# then prints the figures the tests reported.
# Arguments go to step 1's `meson test` (a test name, --suite ...) and skip
# steps 2 to 4; so does SK_TESTS=quick.
# The shared material (test model, llama.cpp reference values) is read from
# ../shared beside the checkout unless SK_SHARED_DIR names another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh --tests
./scripts/build.sh -Dtests=true
meson test -C build --print-errorlogs "$@"
if [ $# -gt 0 ] || [ "${SK_TESTS:-full}" = quick ]; then exit 0; fi

t0=$(date +%s)
echo "== release build (--buildtype=release)" >&2
[ -f build-release/build.ninja ] ||
  meson setup build-release --buildtype=release -Dwerror=true >/dev/null
ninja -C build-release
echo "== sanitizers: ASan+UBSan build (clang) and the whole suite under it" >&2
[ -f build-asan/build.ninja ] ||
  CC=clang meson setup build-asan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fno-sanitize-recover=all -Dfuzzing=true -Dman=disabled >/dev/null
ninja -C build-asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
meson test -C build-asan --print-errorlogs
echo "== fuzzing: each target ${SK_FUZZ_SECONDS:-60} s under ASan+UBSan" >&2
./scripts/run-fuzz.sh build-asan "${SK_FUZZ_SECONDS:-60}"
unset ASAN_OPTIONS UBSAN_OPTIONS
echo "== valgrind memcheck: the integration tests and the daemons they start" >&2
rm -f build/meson-logs/valgrind-*.log
meson test -C build --setup valgrind --print-errorlogs integration integration-sessions \
  integration-sinkctl
echo "== ThreadSanitizer: the threaded parts (pool, daemon, clients)" >&2
[ -f build-tsan/build.ninja ] ||
  CC=clang meson setup build-tsan -Dwerror=true -Db_sanitize=thread -Db_lundef=false \
    -Dman=disabled >/dev/null
ninja -C build-tsan
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 SK_LOAD_SECONDS=10 \
  meson test -C build-tsan --print-errorlogs kernels kernels-types model integration \
    integration-sessions integration-sinkctl persist persist-images hostile hostile-limits \
    sinkctl load
t1=$(date +%s)

echo "== figures"
for log in build/meson-logs/testlog.txt build-asan/meson-logs/testlog.txt \
  build-tsan/meson-logs/testlog.txt; do
  grep -h '^figures:' "$log" | sed "s|^figures:|figures ($(dirname "$(dirname "$log")")):|" || true
done
cat build-asan/fuzz-out/figures.txt
python3 - <<'PY'
import glob, json, re
# valgrind: one log per process (the test, the daemon, sinkctl, shells).
procs = errors = leaked = 0
names = {}
for path in glob.glob("build/meson-logs/valgrind-*.log"):
    text = open(path, errors="replace").read()
    m = re.search(r"ERROR SUMMARY: (\d+) errors", text)
    if not m:
        continue  # a process that exec'd into another (its log ends there)
    procs += 1
    errors += int(m.group(1))
    for kind in ("definitely", "indirectly", "possibly"):
        for b in re.findall(kind + r" lost: ([\d,]+) bytes", text):
            leaked += int(b.replace(",", ""))
    cmd = re.search(r"Command: (\S+)", text)
    name = cmd.group(1).rsplit("/", 1)[-1] if cmd else "?"
    names[name] = names.get(name, 0) + 1
print("figures: valgrind memcheck: %d processes (%s), %d errors, %d bytes leaked" % (
    procs, ", ".join("%s x%d" % kv for kv in sorted(names.items())), errors, leaked))
# Every test of the three runs, and the fuzz targets.
n = {"OK": 0, "FAIL": 0, "SKIP": 0}
for path in ("build/meson-logs/testlog.json", "build-asan/meson-logs/testlog.json",
             "build/meson-logs/testlog-valgrind.json", "build-tsan/meson-logs/testlog.json"):
    for line in open(path):
        r = json.loads(line).get("result", "")
        n["OK" if r in ("OK", "EXPECTEDFAIL") else "SKIP" if r == "SKIP" else "FAIL"] += 1
fuzz = open("build-asan/fuzz-out/figures.txt").read().count(" 0 crashes")
print("counted: the normal build, the ASan+UBSan build, the valgrind run and the TSan run, "
      "plus the "
      "%d fuzz targets that ran without a crash" % fuzz)
print("tests: %d passed, %d failed, %d skipped" % (n["OK"] + fuzz, n["FAIL"], n["SKIP"]))
PY
echo "release, sanitizer, fuzzing, valgrind and TSan steps took $((t1 - t0)) s" >&2
