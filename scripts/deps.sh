#!/usr/bin/env bash
# Installs what sinkd needs (Debian 12 packages):
#   deps.sh           to build and run it (the daemon, sinkctl, libsinkd,
#                     the man pages)
#   deps.sh --python  what the Python client's install needs (python3 -m
#                     venv --system-site-packages sees msgpack and the
#                     build backend flit_core: README, python/README.md)
#   deps.sh --tests   that and what the test suite needs besides
#   deps.sh --packages  that and what building, checking, installing and
#                     purging the Debian packages takes besides debian/control's
#                     Build-Depends (scripts/test-packages.sh)
# --list (after the others) prints the packages, one a line, and installs
# nothing.
set -euo pipefail
build=(build-essential pkg-config meson ninja-build
       libuv1-dev libmsgpack-dev libsystemd-dev
       libinih-dev libxxhash-dev scdoc
       libpcre2-dev  # byte-level BPE pre-tokenizer regexes (UTF, Unicode properties)
       libjansson-dev libhttp-parser-dev)  # the HTTP endpoint's JSON and HTTP (sinkd-http(7))
python=(python3 python3-venv python3-msgpack
        flit)  # flit_core, the Python client's build backend
# systemd: systemd-analyze and systemd-socket-activate for the service
# tests; mandoc, groff-base and man-db: man page lint and the man pages
# systemd-analyze verify looks up.
tests=(libcmocka-dev
       curl python3-msgpack  # the HTTP test (curl --unix-socket) and the Python client
       python3-pip python3-venv flit  # the Python client's offline install
       nodejs  # the HTTP test runs the OpenAI JavaScript SDK (npm: Debian's npm, or nodesource's nodejs)
       systemd mandoc groff-base man-db
       procps  # /bin/kill: the unit's ExecReload, which systemd-analyze verify checks
       gnuplot-nox  # sinkctl eval --plot
       # the test suite's other steps: clang with ASan/UBSan and libFuzzer
       # (libclang-rt-14-dev), llvm-symbolizer for readable reports,
       # valgrind; useradd and setpriv for the isolation test
       clang libclang-rt-14-dev llvm valgrind passwd util-linux python3)
# The packages' checks (scripts/test-packages.sh): building .deb files and
# lintian; man, systemd-analyze, setpriv, userdel and /usr/bin/python3
# with msgpack for the installed programs; procps's /bin/kill (the unit's
# ExecReload). Installed before the packages, so that installing them
# pulls in nothing that purging them would leave.
packages=(dpkg-dev build-essential lintian man-db systemd procps util-linux passwd
          python3 python3-msgpack libmsgpack-dev)
pkgs=("${build[@]}")
list=false
for arg in "$@"; do
  case $arg in
    --tests) pkgs+=("${tests[@]}")
             # npm for the OpenAI SDK test: Debian's package, unless an npm is
             # there already (nodesource's nodejs ships its own and conflicts)
             command -v npm >/dev/null || pkgs+=(npm) ;;
    --python) pkgs+=("${python[@]}") ;;
    --packages) pkgs+=("${packages[@]}") ;;
    --list) list=true ;;
    *) echo "usage: $0 [--python] [--tests] [--packages] [--list]" >&2; exit 2 ;;
  esac
done
if $list; then printf '%s\n' "${pkgs[@]}"; exit 0; fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing: ${missing[*]}" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
