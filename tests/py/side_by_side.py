"""remote-sandbox-mcp and Outpost side by side: the same calls, with the
same arguments, through the official Python MCP SDK, to both servers
configured alike for the same SSH host.

Run by tests/tests/python_sdk.rs when scripts/setup-test-env installed
remote-sandbox-mcp into the SDK's virtual environment. Arguments: the
`outpost` binary, the host, port, user and key file of a test sshd, the
agent's state directory on it, and a scratch directory. For every call it
checks that Outpost answers where remote-sandbox-mcp answers (no error that
it does not give) and that every result key remote-sandbox-mcp returns is in
Outpost's result too, down to nested objects, but for the differences listed
in DIFFERENT (each one documented). Prints each call; exits non-zero on the
first failure.
"""

import asyncio
import json
import os
import shlex
import sys
from datetime import timedelta

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

OUTPOST, HOST, PORT, USER, KEY, REMOTE_DIR, SCRATCH = sys.argv[1:8]

# Result keys remote-sandbox-mcp returns that Outpost deliberately does not,
# by tool: (path, why). A path is dotted; `[]` is any list element.
NO_ECHO = "results do not echo their inputs"
# No watch database: a watch is the view of a job the host supervises,
# named by the job (watch_id, state, exit_code, log_file, command, started,
# ended), not a record of 40 watchdog fields.
WATCH = "a watch is a supervised job's view"
DIFFERENT = {
    "sync_local_to_remote": {
        "local_path": NO_ECHO,
        "remote_path": NO_ECHO,
        "delete_extras": NO_ECHO,
        "pid": "a background push is a task in the server, not a local process",
        "log_file": "check_file_transfer_task returns the log",
    },
    "sync_remote_to_local": {"local_path": NO_ECHO, "remote_path": NO_ECHO},
    "check_file_transfer_task": {
        "progress.*": "progress holds counters (files, bytes, rate); the result the report",
    },
    # A watch is a view of a job every host supervises: watch_id (the job's
    # name), state, exit_code, log_file, command, started, ended; there is
    # no watch database, launchd agent or watchdog heartbeat.
    "list_background_watches": {"watches[].*": WATCH, "status": WATCH},
    "get_background_watch": {"watch.*": WATCH},
    "get_background_watch_progress": {
        "watch.*": WATCH,
        "stored": "the watch is the live job: no stored copy",
        "live": "ditto: its state, log tail and checkpoint are the answer",
    },
    "read_background_watch_log": {"watch.*": WATCH},
    "cancel_background_watch": {"watch.*": WATCH, "status": "the watch's state says it"},
    "watch_background_task": {
        "watch.*": WATCH,
        "status": "the watch's state says it",
        "watch_id": "the watch's watch_id",
        "watch_query_id": "no watch database",
        "persisted_sandboxes": "no watch database",
        "watchdog_setup": "no watchdog daemon: each host's supervisor",
    },
    "get_watchdog_status": {
        "paths": "no watch database",
        "launchd": "no launchd agent",
        "heartbeat": "no watchdog daemon: each host's supervisor",
        "heartbeat_stale": "ditto",
        "watch_counts": "list_background_watches counts them",
    },
}


def allowed(tool, key):
    """Whether `key` is a documented difference of `tool`."""
    for pattern in DIFFERENT.get(tool, {}):
        if key == pattern or (pattern.endswith(".*") and key.startswith(pattern[:-1])):
            return True
    return False


def env_for(server: str) -> dict:
    home = os.path.join(SCRATCH, f"home-{server}")
    os.makedirs(home, exist_ok=True)
    return {
        "HOME": home,
        "PATH": os.environ["PATH"],
        "REMOTE_HOST": HOST,
        "REMOTE_PORT": PORT,
        "REMOTE_USER": USER,
        "REMOTE_KEY_FILE": KEY,
        "REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS": "1",
        # A push of more files goes to the background, in both servers.
        "REMOTE_SANDBOX_INLINE_SYNC_MAX_FILES": "5",
    }


def servers():
    seed = StdioServerParameters(
        command=sys.executable,
        args=["-m", "remote_sandbox_mcp.server"],
        env=env_for("seed"),
        cwd=SCRATCH,
    )
    outpost_env = env_for("outpost")
    # The same host, user and key, from a config file that also keeps the
    # agent's state where this sshd's tests keep it (the environment alone
    # would put it in the test account's ~/.outpost, outliving the test).
    for key in ("REMOTE_HOST", "REMOTE_PORT", "REMOTE_USER", "REMOTE_KEY_FILE"):
        del outpost_env[key]
    config = os.path.join(SCRATCH, "outpost.toml")
    with open(config, "w") as f:
        f.write(f'[[sandbox]]\nname = "{HOST}"\nhost = "{HOST}"\nport = {PORT}\n'
                f'user = "{USER}"\nkey_file = "{KEY}"\nremote_dir = "{REMOTE_DIR}"\n')
    outpost_env["OUTPOST_CONFIG"] = config
    outpost = StdioServerParameters(
        command=OUTPOST, args=["mcp"], env=outpost_env, cwd=SCRATCH
    )
    return seed, outpost


def payload(result):
    """A result as JSON, and whether it is an error (remote-sandbox-mcp's
    errors are results with an `error` key)."""
    if result.structuredContent is not None:
        value = result.structuredContent
        # FastMCP wraps a dict return as {"result": …} only for non-dicts.
        if set(value) == {"result"} and not isinstance(value["result"], (str, int)):
            value = value["result"]
    else:
        text = "".join(getattr(c, "text", "") for c in result.content)
        try:
            value = json.loads(text)
        except ValueError:
            value = {"text": text}
    is_error = result.isError or (isinstance(value, dict) and "error" in value)
    return value, is_error


def missing_keys(seed, ours, path=""):
    """Keys (dotted paths) of `seed` that `ours` lacks."""
    out = []
    if isinstance(seed, dict) and isinstance(ours, dict):
        for key, value in seed.items():
            where = f"{path}.{key}" if path else key
            if key not in ours:
                out.append(where)
            else:
                out += missing_keys(value, ours[key], where)
    elif isinstance(seed, list) and isinstance(ours, list) and seed and ours:
        out += missing_keys(seed[0], ours[0], f"{path}[]")
    return out


async def main():
    seed_params, outpost_params = servers()
    failures = []
    async with stdio_client(seed_params) as (sr, sw), stdio_client(outpost_params) as (orr, ow):
        async with ClientSession(sr, sw) as seed, ClientSession(orr, ow) as ours:
            await seed.initialize()
            await ours.initialize()

            async def both(tool, args, *, expect_error=False, apart=None, ours_args=None):
                """`apart`: (argument, path) made one per server, so that
                neither finds the other's work; `ours_args`: Outpost's where
                an id differs (a watch's)."""
                timeout = timedelta(seconds=120)
                mine = dict(ours_args if ours_args is not None else args)
                if apart:
                    key, base = apart
                    args = {**args, key: base + "-seed"}
                    mine[key] = base + "-ours"
                s = await seed.call_tool(tool, args, read_timeout_seconds=timeout)
                o = await ours.call_tool(tool, mine, read_timeout_seconds=timeout)
                sv, serr = payload(s)
                ov, oerr = payload(o)
                line = f"{tool}({json.dumps(args)[:80]})"
                if serr != expect_error:
                    failures.append(f"{line}: remote-sandbox-mcp answered {sv}")
                    print(f"?? {line}: remote-sandbox-mcp answered {json.dumps(sv)[:300]}")
                    return sv, ov
                if oerr and not serr:
                    failures.append(f"{line}: Outpost erred where remote-sandbox-mcp did not: {ov}")
                    print(f"FAIL {line}: Outpost: {json.dumps(ov)[:300]}")
                    return sv, ov
                if not serr:
                    missing = [k for k in missing_keys(sv, ov) if not allowed(tool, k)]
                    if missing:
                        failures.append(f"{line}: Outpost lacks {missing}")
                        print(f"FAIL {line}: lacks {missing}\n  seed: {json.dumps(sv)[:400]}\n  ours: {json.dumps(ov)[:400]}")
                        return sv, ov
                print(f"ok {line}")
                return sv, ov

            await both("list_sandboxes", {})
            await both("list_sandboxes", {"check_resources": True})
            await both("select_sandbox", {"sandbox_name": HOST})
            await both("get_active_sandbox", {})
            await both("exec_bash", {"command": "echo out; echo err >&2; exit 3"})
            await both("exec_bash", {"command": "pwd", "cwd": "/tmp"})
            await both("exec_bash", {"command": "sleep 5", "timeout_s": 1})

            work = os.path.join(SCRATCH, "tree")
            os.makedirs(os.path.join(work, "sub"), exist_ok=True)
            for name, text in [("a.txt", "a\n"), ("sub/b.txt", "b\n")]:
                with open(os.path.join(work, name), "w") as f:
                    f.write(text)
            for server in ("seed", "ours"):
                os.makedirs(os.path.join(SCRATCH, f"pulled-{server}"), exist_ok=True)
            # Its own names on the host, so that no earlier run's files count.
            remote = "outpost-side-by-side-" + os.path.basename(SCRATCH)
            await both("sync_local_to_remote", {"local_path": work, "remote_path": remote})
            await both("list_remote_files", {"remote_path": remote, "recursive": True})
            await both("read_remote_file", {"remote_path": f"{remote}/a.txt"})
            await both("sync_remote_to_local", {"remote_path": remote},
                       apart=("local_path", os.path.join(SCRATCH, "pull")))
            # One file: into a directory, then as the target path.
            one = os.path.join(work, "a.txt")
            await both("sync_local_to_remote", {"local_path": one, "remote_path": remote})
            await both("sync_local_to_remote",
                       {"local_path": one, "remote_path": remote + "/sub/a.txt"})
            # Into a local directory each.
            await both("sync_remote_to_local", {"remote_path": remote + "/sub/a.txt"},
                       apart=("local_path", os.path.join(SCRATCH, "pulled")))
            for server in ("seed", "ours"):
                with open(os.path.join(SCRATCH, f"pulled-{server}", "a.txt")) as f:
                    if f.read() != "a\n":
                        failures.append(f"{server}: the pulled file differs")
            await both("read_remote_file", {"remote_path": remote + "/missing"}, expect_error=True)
            await both("select_sandbox", {"sandbox_name": "nowhere"}, expect_error=True)
            await both("exec_bash", {"command": "seq 1 100000", "max_output_chars": 100})
            many = os.path.join(SCRATCH, "many")
            os.makedirs(many, exist_ok=True)
            for i in range(20):
                with open(os.path.join(many, f"f{i}.txt"), "w") as f:
                    f.write(f"{i}\n" * 1000)
            sv, ov = await both("sync_local_to_remote", {"local_path": many},
                                apart=("remote_path", remote + "-bg"))
            for _ in range(100):
                s = await seed.call_tool("check_file_transfer_task", {"task_id": sv["task_id"]})
                if payload(s)[0].get("status") not in ("queued", "running"):
                    break
                await asyncio.sleep(0.1)
            for _ in range(100):
                o = await ours.call_tool("check_file_transfer_task", {"task_id": ov["task_id"]})
                if payload(o)[0].get("status") != "running":
                    break
                await asyncio.sleep(0.1)
            sc, oc = payload(s)[0], payload(o)[0]
            missing = [k for k in missing_keys(sc, oc)
                       if not allowed("check_file_transfer_task", k)]
            if missing:
                failures.append(f"check_file_transfer_task: Outpost lacks {missing}")
                print(f"FAIL check_file_transfer_task: lacks {missing}\n  seed: {json.dumps(sc)[:600]}\n  ours: {json.dumps(oc)[:600]}")
            else:
                print("ok check_file_transfer_task")

            await both("cancel_file_transfer_task", {"task_id": sv["task_id"]},
                       ours_args={"task_id": ov["task_id"]})

            job1, job2 = f"{remote}-1", f"{remote}-2"
            started = {"command": "echo started; sleep 1; echo done; exit 4",
                       "session_name": job1, "ensure_watchdog": False}
            sv, ov = await both("exec_bash_background", started)
            await asyncio.sleep(3)
            await both("check_background_task", {"tmux_session": job1})
            await both("check_background_task", {"tmux_session": job1, "watch_id": 0})
            await both("list_background_watches", {})
            await both("get_watchdog_status", {})
            # The watch tools, each server with its own watch id.
            ids = ({"watch_id": sv["watch_id"]}, {"watch_id": ov["watch_id"]})
            for tool in ("get_background_watch", "get_background_watch_progress",
                         "read_background_watch_log", "list_background_watch_events"):
                await both(tool, ids[0], ours_args=ids[1])
            sv, ov = await both("exec_bash_background_watch",
                                {"command": "sleep 30", "session_name": job2,
                                 "ensure_watchdog": False})
            watch = {"tmux_session": job2, "ensure_watchdog": False}
            await both("watch_background_task", {**watch, "log_file": sv["log_file"]},
                       ours_args={**watch, "log_file": ov["log_file"]})
            await both("cancel_background_watch", {"watch_id": sv["watch_id"]},
                       ours_args={"watch_id": ov["watch_id"]})
            await both("exec_bash", {"command": f"tmux kill-session -t {job2} || true"})
            await both("exec_bash",
                       {"command": f"rm -rf {shlex.quote(remote)} {shlex.quote(remote)}-bg-*"})

    if failures:
        print("\n".join(["", "differences:"] + failures))
        raise SystemExit(1)
    print("side by side: every call answered alike")


asyncio.run(main())
