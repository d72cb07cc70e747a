#!/usr/bin/env bash
# Installs what building and testing Reservoir needs on Debian/Ubuntu, skipping
# what is already there (so a prepared machine does not touch the network).
set -euo pipefail
# clang-tidy: the static checks of src/ (.clang-tidy). libcli11-dev: reservoir-replay's
# command line (header-only); libcairo2-dev and pkg-config: its PNG plots (optional:
# without them PNG is refused with a message).
packages=(build-essential cmake libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev python3
          clang clang-tidy libclang-rt-14-dev libcli11-dev libcairo2-dev pkg-config)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
