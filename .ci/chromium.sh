#!/usr/bin/env bash
# Debian's chromium for the panel's browser tests: Playwright drives
# /usr/bin/chromium and never downloads a browser of its own.
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q chromium >/dev/null \
  || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium >/dev/null; }
