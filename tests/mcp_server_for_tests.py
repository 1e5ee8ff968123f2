"""An MCP server for tests/test_mcp.py, built with the `mcp` SDK's server API: tools that echo, wait, crash
the server, return an image or count their calls. `python tests/mcp_server_for_tests.py` serves stdio;
`... http PORT` serves streamable HTTP at http://127.0.0.1:PORT/mcp. With `HONE_TEST_MCP_PIDS` set, the
process appends its pid to that file at start (the tests check it is gone when it should be)."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("hone-test")
calls = 0
# A 1x1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e527de0000000049454e44ae426082"
)


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
async def wait(seconds: float) -> str:
    """Wait, then say so."""
    await asyncio.sleep(seconds)
    return f"waited {seconds:g} s"


@server.tool()
def crash() -> str:
    """End the server process at once."""
    os._exit(3)


@server.tool()
def picture() -> Image:
    """A tiny image."""
    return Image(data=PNG, format="png")


@server.tool()
def count() -> int:
    """How many times this tool was called in this server process."""
    global calls
    calls += 1
    return calls


if __name__ == "__main__":
    if pids := os.environ.get("HONE_TEST_MCP_PIDS"):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
    if sys.argv[1:2] == ["http"]:
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
