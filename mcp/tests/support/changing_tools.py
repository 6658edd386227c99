"""A tiny MCP server over stdio whose tool list changes on request: the test fixture for
`notifications/tools/list_changed`. Plain Python (standard library only), newline-delimited
JSON-RPC 2.0 as the MCP stdio transport says.

It is written by hand rather than on the Python SDK so the order on the wire is exact: `add_tool`
registers a tool NAME (answering `NAME says TEXT`), writes `notifications/tools/list_changed`, and
only then answers the call; `remove_tool` takes a tool away the same way. (The SDK installed with
mcp-server-time, `mcp` 2.3, routes change notifications through `subscriptions/listen`, and its
request-scoped send did not complete over stdio.)
"""

import json
import sys

PROTOCOL = "2025-06-18"

NAME_ARG = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "the tool's name"}},
    "required": ["name"],
}
TEXT_ARG = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}

tools = {
    "add_tool": {"description": "Adds a tool called NAME.", "inputSchema": NAME_ARG},
    "remove_tool": {"description": "Removes the tool called NAME.", "inputSchema": NAME_ARG},
}
added = set()


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text_result(text, is_error=False):
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def call(params):
    name = params.get("name")
    args = params.get("arguments") or {}
    if name in ("add_tool", "remove_tool"):
        target = args.get("name")
        if not isinstance(target, str) or not target:
            return text_result("`name` must be a non-empty string", True)
        if name == "add_tool":
            tools[target] = {
                "description": f"The tool {target}, added at run time.",
                "inputSchema": TEXT_ARG,
            }
            added.add(target)
        else:
            if target not in added:
                return text_result(f"no added tool `{target}`", True)
            added.discard(target)
            del tools[target]
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return text_result(f"{'added' if name == 'add_tool' else 'removed'} {target}")
    if name in added:
        return text_result(f"{name} says {args.get('text', '')}")
    return None


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if "id" not in message or "method" not in message:
        continue  # a notification or a response
    method, rid = message["method"], message["id"]
    params = message.get("params") or {}
    if method == "initialize":
        result = {
            "protocolVersion": PROTOCOL,
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "changing-tools", "version": "1"},
        }
    elif method == "tools/list":
        result = {
            "tools": [
                {"name": n, "description": t["description"], "inputSchema": t["inputSchema"]}
                for n, t in sorted(tools.items())
            ]
        }
    elif method == "tools/call":
        result = call(params)
        if result is None:
            send({"jsonrpc": "2.0", "id": rid,
                  "error": {"code": -32602, "message": f"unknown tool {params.get('name')!r}"}})
            continue
    elif method == "ping":
        result = {}
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})
        continue
    send({"jsonrpc": "2.0", "id": rid, "result": result})
