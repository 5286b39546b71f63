#!/bin/sh
# Checks the build dependencies; installs them when run as root, else says how.
missing=""
pkg-config --exists libcjson 2>/dev/null || missing="$missing libcjson-dev"
pkg-config --exists yaml-0.1 2>/dev/null || missing="$missing libyaml-dev"
pkg-config --exists zlib 2>/dev/null || missing="$missing zlib1g-dev"
command -v pkg-config >/dev/null 2>&1 || missing="pkg-config $missing"
command -v cc >/dev/null 2>&1 || missing="$missing build-essential"
# make test also runs Python oracles (conformance checker, generators, venv).
if [ "${1:-}" = test ]; then
  command -v python3 >/dev/null 2>&1 || missing="$missing python3"
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$missing python3-venv"
fi
[ -z "$missing" ] && exit 0
missing=$(echo $missing) # one space between names
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tpshard: installing missing build dependencies: $missing" >&2
  log=$(mktemp "${TMPDIR:-/tmp}/tpshard-apt.XXXXXX")
  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends $missing) >"$log" 2>&1; then
    echo "tpshard: installed $missing" >&2
    rm -f "$log"
  else
    tail -n 15 "$log" >&2
    echo "tpshard: error: apt-get install $missing failed (full output: $log)" >&2
    exit 1
  fi
else
  echo "tpshard: error: missing build dependencies: $missing" >&2
  echo "tpshard: install them with: sudo apt-get install $missing" >&2
  exit 1
fi
