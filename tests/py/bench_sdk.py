"""exec_bash('true') on the local sandbox through the official Python MCP SDK
(1.x), which validates every structured result against the tool's output
schema: with that validation as shipped, and with it switched off, in turns
on one session. Prints medians and the ratio (run by `scripts/bench python`).

Argument: the `outpost` binary.
"""

import asyncio
import os
import statistics
import sys
import tempfile
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROUNDS = 300


async def main() -> None:
    home = tempfile.mkdtemp(prefix="outpost-bench-sdk-")
    params = StdioServerParameters(
        command=sys.argv[1],
        args=["mcp"],
        env={"HOME": home, "PATH": os.environ["PATH"]},
        cwd=home,
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            validate = session._validate_tool_result

            async def skip(name, result):
                return None

            timings = {"validated": [], "not validated": []}
            for i in range(2 * ROUNDS):
                mode = "validated" if i % 2 == 0 else "not validated"
                session._validate_tool_result = validate if i % 2 == 0 else skip
                started = time.perf_counter()
                r = await session.call_tool("exec_bash", {"command": "true", "timeout_s": 30})
                took = time.perf_counter() - started
                assert not r.isError and r.structuredContent["exit_code"] == 0, r
                if i >= 40:
                    timings[mode].append(took)
    on = statistics.median(timings["validated"]) * 1e3
    off = statistics.median(timings["not validated"]) * 1e3
    print()
    print(f"official Python SDK: exec_bash('true') on the local sandbox ({ROUNDS} calls each)")
    print(f"  results validated          median {on:.2f} ms")
    print(f"  validation switched off    median {off:.2f} ms")
    print(f"  ratio                      {on / off:.2f}x")


asyncio.run(main())
