#!/usr/bin/env bash
# Installs what building and testing twell needs (Debian/Ubuntu), only what is missing: safe to
# run again, and a no-op without apt, root or network when everything is already there.
set -euo pipefail

# clang and its runtime libraries: the libFuzzer targets (scripts/fuzz.sh).
packages=(cmake g++ ninja-build libeigen3-dev doctest-dev python3-scipy python3-numpy python3-matplotlib clang
  libclang-rt-14-dev)

if ! command -v dpkg-query >/dev/null; then
  echo "setup: not a Debian-like system; make sure these (or their equivalents) are installed: ${packages[*]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all build and test dependencies are installed"
  exit 0
fi

if ! command -v apt-get >/dev/null; then
  echo "setup: missing ${missing[*]}, and there is no apt-get here; install them by hand" >&2
  exit 1
fi
sudo=()
if ((EUID != 0)); then
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
