#!/usr/bin/env bash
# Installs what building and testing twell needs (Debian/Ubuntu), only what is missing: safe to
# run again, and a no-op without apt, root or network when everything is already there.
set -euo pipefail

# clang and its runtime libraries: the libFuzzer targets (scripts/fuzz.sh). locales: a
# comma-decimal locale (de_DE.UTF-8, generated below) for the .mtx reader's locale test, which
# otherwise checks the C locale only.
packages=(cmake g++ ninja-build libeigen3-dev doctest-dev python3-scipy python3-numpy python3-matplotlib clang
  libclang-rt-14-dev locales)
comma_locale="de_DE.UTF-8"

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

sudo=()
if ((EUID != 0)); then
  sudo=(sudo)
fi

# Generates comma_locale where it is missing and locale-gen can run; otherwise says why the test
# will check the C locale only (nothing fails for it).
ensure_comma_locale() {
  if locale -a 2>/dev/null | grep -qix "${comma_locale/UTF-8/utf8}"; then
    return 0
  fi
  if ! command -v locale-gen >/dev/null || [[ ! -e /etc/locale.gen ]]; then
    echo "setup: no locale-gen here; the locale test will check the C locale only"
    return 0
  fi
  echo "setup: generating the $comma_locale locale"
  if ! grep -qx "$comma_locale UTF-8" /etc/locale.gen; then
    echo "$comma_locale UTF-8" | "${sudo[@]}" tee -a /etc/locale.gen >/dev/null
  fi
  "${sudo[@]}" locale-gen >/dev/null || echo "setup: locale-gen failed; the locale test will check the C locale only"
}

if ((${#missing[@]} == 0)); then
  ensure_comma_locale
  echo "setup: all build and test dependencies are installed"
  exit 0
fi

if ! command -v apt-get >/dev/null; then
  echo "setup: missing ${missing[*]}, and there is no apt-get here; install them by hand" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
ensure_comma_locale
