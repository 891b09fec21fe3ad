#!/usr/bin/env bash
# Installs everything fdpp needs to build and test on a Debian 12 machine (idempotent), and fetches
# the default model. Safe to run again: each step is skipped when already done.
#   FDPP_SKIP_APT=1   skip the apt-get step (packages installed by other means)
#   FDPP_SKIP_MODEL=1 skip fetching the default model
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Debian packages (what each is for: README.md, "Dependencies").
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config python3-pip
  libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libomp-dev
  libgtest-dev googletest clang libminizip-dev
  libsentencepiece-dev libcpp-httplib-dev python3-venv zstd xz-utils
)

if [[ "${FDPP_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    [[ $(id -u) != 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

if [[ "${FDPP_SKIP_MODEL:-0}" != 1 ]]; then
  bash "$here/fetch-default-model.sh"
fi
