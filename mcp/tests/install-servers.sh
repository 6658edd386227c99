#!/usr/bin/env bash
# Installs the real MCP servers the dsh-mcp tests run against into the project's own folder
# `.mcp-servers/` (never globally): `@modelcontextprotocol/server-everything` from the npm registry
# and `mcp-server-time` from PyPI (in a virtual environment). Safe to run again: it reinstalls only
# what is missing. Usage: mcp/tests/install-servers.sh [PROJECT_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
dest="$root/.mcp-servers"
mkdir -p "$dest/node"
if [ ! -f "$dest/node/node_modules/@modelcontextprotocol/server-everything/package.json" ]; then
  npm install --no-audit --no-fund --prefix "$dest/node" @modelcontextprotocol/server-everything
fi
if [ ! -x "$dest/python/bin/mcp-server-time" ]; then
  python3 -m venv "$dest/python"
  "$dest/python/bin/pip" install --quiet mcp-server-time
fi
