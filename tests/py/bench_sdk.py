"""exec_bash('true'), and a no-op sync_local_to_remote of 200 files, on the
local sandbox through the official Python MCP SDK (1.x), which validates
every structured result against the tool's output schema: with that
validation as shipped, and with it switched off, in turns on one session.
Prints medians and the ratio (run by `scripts/bench python`).

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

            async def measure(tool, args, check, rounds):
                timings = {True: [], False: []}
                for i in range(2 * rounds):
                    on = i % 2 == 0
                    session._validate_tool_result = validate if on else skip
                    started = time.perf_counter()
                    r = await session.call_tool(tool, args)
                    took = time.perf_counter() - started
                    assert not r.isError and check(r.structuredContent), r
                    if i >= 40:
                        timings[on].append(took)
                return [statistics.median(timings[on]) * 1e3 for on in (True, False)]

            tree = os.path.join(home, "tree")
            for i in range(200):
                os.makedirs(os.path.join(tree, f"d{i % 10}"), exist_ok=True)
                with open(os.path.join(tree, f"d{i % 10}", f"f{i}"), "w") as f:
                    f.write(str(i) * 100)
            push = {"local_path": tree, "remote_path": os.path.join(home, "copy")}
            results = [
                ("exec_bash('true')", await measure(
                    "exec_bash", {"command": "true", "timeout_s": 30},
                    lambda c: c["exit_code"] == 0, ROUNDS)),
                ("no-op sync of 200 files", await measure(
                    "sync_local_to_remote", push, lambda c: c is not None, ROUNDS // 3)),
            ]
    print()
    print(f"official Python SDK on the local sandbox, results validated / not")
    for label, (on, off) in results:
        print(f"  {label:<26} median {on:.2f} / {off:.2f} ms  ratio {on / off:.2f}x")


asyncio.run(main())
