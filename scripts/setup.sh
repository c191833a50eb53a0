#!/usr/bin/env bash
# Installs every dependency of tdx: Debian's packages (MLIR 22, MPI, the compilers, Chromium)
# and a Python virtual environment with the pinned packages of requirements.txt (torch among
# them). Idempotent: nothing is fetched when everything is present.
#
# Environment:
#   TDX_PYTHON  build against this interpreter's torch instead of making a virtual
#               environment (a torch the user already has; it must be a supported one)
#   TDX_VENV    where the virtual environment goes (default ~/.cache/tdx/venv-<hash of
#               requirements.txt>: outside the checkout, so a second clone finds it ready)
#   TDX_WHEELS  where downloaded wheels are kept (default ~/.cache/tdx/wheels)
# Prints the interpreter on its last line: "setup: python /path/to/python".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

PACKAGES=(
  # MLIR / LLVM 22 (lit, FileCheck and not come with llvm-22-tools, pulled in by llvm-22-dev)
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  # Python: the interpreter the virtual environment is made from, its headers, pybind11
  python3 python3-dev python3-venv pybind11-dev
  # the plan page's screenshot test (tdx.explain rendered by headless Chromium)
  chromium
  # MPI runtime for the multi-rank backends; Sleef for the emitted CPU kernels' vector math
  libopenmpi-dev openmpi-bin libsleef-dev
  # the test hosts (scripts/hosts.sh): ip netns, veth, bridges and tc
  iproute2
  # the networked tensor store's transport (UCX: TCP here, RDMA where hardware has it)
  libucx-dev
  # build tools
  cmake ninja-build ccache g++ libgtest-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} Debian packages already installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
      echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
    fi
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  unavailable=()
  for p in "${missing[@]}"; do
    if ! apt-cache show "$p" >/dev/null 2>&1; then unavailable+=("$p"); fi
  done
  if [ ${#unavailable[@]} -ne 0 ]; then
    echo "setup: error: Debian's archive here does not offer: ${unavailable[*]}" >&2
    echo "setup: check /etc/apt/sources.list (bookworm and bookworm-security are needed for MLIR 22)" >&2
    exit 1
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python side.
if [ -n "${TDX_PYTHON:-}" ]; then
  python="$TDX_PYTHON"
  echo "setup: using TDX_PYTHON=$python (no virtual environment made)"
else
  hash="$(sha256sum "$root/requirements.txt" | cut -c1-12)"
  cache="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/tdx"
  venv="${TDX_VENV:-$cache/venv-$hash}"
  wheels="${TDX_WHEELS:-$cache/wheels}"
  python="$venv/bin/python"
  if [ ! -f "$venv/.tdx-complete" ]; then
    echo "setup: making the virtual environment $venv (requirements.txt)"
    rm -rf "$venv"
    mkdir -p "$wheels"
    /usr/bin/python3 -m venv "$venv"
    # Wheels are downloaded once into $wheels, then installed from there: a second
    # environment (another clone, a changed pin) downloads only what is new.
    "$python" -m pip download -q -d "$wheels" -r "$root/requirements.txt"
    "$python" -m pip install -q --no-index --find-links "$wheels" -r "$root/requirements.txt"
    touch "$venv/.tdx-complete"
  else
    echo "setup: virtual environment $venv is complete"
  fi
fi
# A torch tdx can build against, or a clear refusal.
"$python" "$root/python/tdx/_torch_version.py" || exit 1
echo "setup: python $python"
