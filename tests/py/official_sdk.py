"""Outpost through the official Python MCP SDK (1.x), which validates every
structured result against the tool's output schema.

Run by tests/tests/python_sdk.rs with the SDK's virtual environment made by
scripts/setup-test-env. Arguments: the `outpost` binary, a config file that
names an SSH sandbox "box", a scratch directory (the server's start
directory, so its local root), and the URL and token of an `outpost mcp
--http` the test started. Prints what it checked; exits non-zero on the
first failure.
"""

import asyncio
import os
import sys
import time
from datetime import timedelta

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import Implementation

import httpx
from mcp.client.streamable_http import streamablehttp_client

OUTPOST, CONFIG, SCRATCH, HTTP_URL, HTTP_TOKEN = sys.argv[1:6]


def server(config_text: str) -> StdioServerParameters:
    path = os.path.join(SCRATCH, f"config-{abs(hash(config_text))}.toml")
    with open(CONFIG) as base, open(path, "w") as out:
        out.write(config_text + "\n" + base.read())
    return StdioServerParameters(
        command=OUTPOST,
        args=["mcp"],
        env={
            "HOME": os.environ["HOME"],
            "PATH": os.environ["PATH"],
            "OUTPOST_CONFIG": path,
            # The large sync below stays inline, where it reports progress.
            "REMOTE_SANDBOX_INLINE_SYNC_MAX_BYTES": str(1 << 30),
        },
        cwd=SCRATCH,
    )


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


async def call(session, tool, args, progress=None):
    result = await session.call_tool(
        tool, args, read_timeout_seconds=timedelta(seconds=120), progress_callback=progress
    )
    return result


def structured(result):
    check(not result.isError, f"no error: {result.content}")
    return result.structuredContent


class Progress:
    def __init__(self):
        self.seen = []

    async def __call__(self, progress, total, message):
        self.seen.append((progress, total, message or ""))

    def take(self):
        seen, self.seen = self.seen, []
        return seen


async def long_calls() -> None:
    params = server("[client_budget_s]\ndefault = 60")
    async with stdio_client(params) as (read, write):
        async with ClientSession(
            read, write, client_info=Implementation(name="sdk-check", version="1")
        ) as session:
            await session.initialize()
            # As below: no info-level job notification racing the close.
            await session.set_logging_level("warning")
            progress = Progress()

            # A 20 s exec_bash over SSH: progress at once and every few seconds.
            command = "for i in $(seq 1 10); do echo tick-$i; sleep 2; done"
            r = structured(
                await call(session, "exec_bash", {"command": command, "sandbox_name": "box"}, progress)
            )
            check(r["exit_code"] == 0 and r["stdout"].count("tick-") == 10, "20 s exec_bash ran")
            seen = progress.take()
            check(len(seen) >= 5, f"exec_bash progress: {len(seen)} notifications")
            check(any("tick-" in m for _, _, m in seen), "exec_bash progress names the last line")

            # wait_background_task: the job's state and last line.
            r = structured(
                await call(
                    session,
                    "exec_bash_background",
                    {"command": "echo waiting; sleep 7; echo end", "sandbox_name": "box"},
                )
            )
            name = r["tmux_session"]
            r = structured(
                await call(
                    session,
                    "wait_background_task",
                    {"name": name, "timeout_s": 60, "sandbox_name": "box"},
                    progress,
                )
            )
            check(r["reason"] == "ended" and r["exit_code"] == 0, "wait_background_task ended")
            seen = progress.take()
            check(len(seen) >= 2, f"wait progress: {len(seen)} notifications")
            check(any("waiting" in m for _, _, m in seen), "wait progress names the last line")

            # A large sync: files and bytes done of total.
            tree = os.path.join(SCRATCH, "big")
            os.makedirs(tree, exist_ok=True)
            for i in range(4):
                with open(os.path.join(tree, f"part-{i}.bin"), "wb") as f:
                    f.write(os.urandom(48 << 20))
            started = time.monotonic()
            r = structured(
                await call(
                    session,
                    "sync_local_to_remote",
                    {"local_path": tree, "remote_path": "sdk-big", "sandbox_name": "box"},
                    progress,
                )
            )
            took = time.monotonic() - started
            check(r.get("mode") == "inline" and r.get("uploaded_files") == 4, f"sync sent: {r}")
            seen = progress.take()
            check(len(seen) >= 1, f"sync progress at once: {seen}")
            # One notification every 3 s: a sync that took longer reports
            # bytes done of the total.
            if took > 4:
                check(any(t for _, t, _ in seen), f"sync progress with a total: {seen}")

            # remote-sandbox-mcp's calls as its clients send them.
            r = structured(
                await call(
                    session,
                    "check_background_task",
                    {"tmux_session": name, "watch_id": 0, "last_n_lines": 5, "sandbox_name": "box"},
                )
            )
            check(r["running"] is False and r["exit_code"] == 0, "check_background_task by name, watch_id 0")
            r = await call(session, "exec_bash", {"command": "true", "timout_s": 3})
            text = " ".join(c.text for c in r.content)
            check(r.isError and "did you mean `timeout_s`" in text, f"a typo is named: {text}")


async def a_client_with_a_short_budget() -> None:
    params = server("[client_budget_s]\ncodex = 5")
    async with stdio_client(params) as (read, write):
        async with ClientSession(
            read, write, client_info=Implementation(name="codex-mcp-client", version="1")
        ) as session:
            await session.initialize()
            # The jobs these calls hand over end with an info-level log
            # notification; one that lands as the session closes makes the
            # SDK's reader raise BrokenResourceError. This client asks only
            # for warnings (a failed job's end would still come).
            await session.set_logging_level("warning")
            for sandbox in ["local", "box"]:
                started = time.monotonic()
                r = structured(
                    await call(
                        session,
                        "exec_bash",
                        {"command": "echo begun; sleep 8; echo done", "sandbox_name": sandbox},
                    )
                )
                took = time.monotonic() - started
                check(r.get("running") is True and took < 7.5, f"{sandbox}: answered in {took:.1f} s: {r}")
                check(r["next"] == f'wait_background_task(name="{r["job"]}")', f"{sandbox}: next call")
                w = structured(
                    await call(
                        session,
                        "wait_background_task",
                        {"name": r["job"], "timeout_s": 60, "sandbox_name": sandbox},
                    )
                )
                check(
                    w["exit_code"] == 0 and w["output"] == "begun\ndone\n",
                    f"{sandbox}: the job ended with every byte: {w}",
                )


async def over_http(who: str) -> str:
    headers = {"Authorization": f"Bearer {HTTP_TOKEN}"}
    async with streamablehttp_client(HTTP_URL, headers=headers) as (read, write, _):
        async with ClientSession(
            read, write, client_info=Implementation(name=who, version="1")
        ) as session:
            await session.initialize()
            r = structured(await call(session, "exec_bash", {"command": f"echo {who}", "timeout_s": 30}))
            return r["stdout"]


async def streamable_http() -> None:
    # Two clients at once, each with the token.
    outs = await asyncio.gather(over_http("first"), over_http("second"))
    check(outs == ["first\n", "second\n"], f"two HTTP clients at once: {outs}")
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient() as raw:
        for label, extra in [
            ("no token", {}),
            ("a wrong token", {"Authorization": "Bearer not-the-token"}),
        ]:
            r = await raw.post(HTTP_URL, json=hello, headers={**accept, **extra})
            check(r.status_code == 401, f"{label}: {r.status_code}")
        r = await raw.post(
            HTTP_URL,
            json=hello,
            headers={
                **accept,
                "Authorization": f"Bearer {HTTP_TOKEN}",
                "Origin": "http://evil.example",
            },
        )
        check(r.status_code == 403, f"a foreign Origin: {r.status_code}")


async def main() -> None:
    await asyncio.gather(long_calls(), a_client_with_a_short_budget(), streamable_http())


asyncio.run(main())
