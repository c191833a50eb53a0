#!/usr/bin/env bash
# Installs every dependency of tdx from Debian's package archive. Idempotent: packages that are
# already installed are skipped, and nothing is fetched when everything is present.
set -euo pipefail

PACKAGES=(
  # MLIR / LLVM 22 (lit, FileCheck and not come with llvm-22-tools, pulled in by llvm-22-dev)
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  # PyTorch 1.13 for Python and C++, with a fast BLAS
  python3-torch libtorch-dev libopenblas0-pthread python3-torchvision
  # Python bindings and tests
  pybind11-dev python3-pybind11 python3-dev python3-pytest python3-pytest-xdist python3-tqdm
  # the examples' loss curves (examples/train_char_gpt.py), and the plan page's screenshot test
  # (tdx.explain rendered by headless Chromium, read back with PIL)
  python3-matplotlib chromium python3-pil
  # MPI runtime for the multi-rank backends
  libopenmpi-dev openmpi-bin libsleef-dev
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
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

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
echo "setup: done"
