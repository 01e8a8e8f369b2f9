# The Python side of an Outpost code context: one interpreter whose state
# lasts between runs. outpost-agent's job daemon starts it with `python3 -u`
# (inside the sandbox's isolation, if any) and sends this file as the first
# line on fd 3. Requests come on fd 3 and answers leave on fd 4, one JSON
# object per line; fds 1 and 2 stay the program's own (pipes the daemon
# reads), so print(), os.write(1, ...) or a C extension's output can never
# corrupt a frame, and stdin is /dev/null, so input() fails cleanly.
#
# After run N the worker writes run N's marker to fds 1 and 2: the daemon
# reads each stream up to it, so a run's output is complete and never bleeds
# into the next one.

import ast
import base64
import builtins
import glob
import importlib
import io
import json
import linecache
import os
import signal
import site
import sys
import time
import traceback
import types

WORKER_FILE = "<outpost-worker>"
# Caps on what one value may add to an answer; the daemon caps the total.
MAX_TEXT = 1 << 20
MAX_ERROR = 64 << 10
# Values one run may display; later ones are counted, not kept.
MAX_RESULTS = 100

_replies = os.fdopen(4, "wb", buffering=0)
_mark = os.environ.pop("OUTPOST_WORKER_MARK", "").encode()
_venv = os.environ.pop("OUTPOST_VENV", "")
_venv_seen = {}
_in_cell = False
# An interrupt that came after a run was read but before its code started:
# the code starts by raising it.
_taking = False
_interrupted = False
_displayed = []
_dropped = [0]
_pid = os.getpid()

_main = types.ModuleType("__main__")
_main.__dict__["__builtins__"] = builtins
sys.modules["__main__"] = _main
namespace = _main.__dict__


def _on_interrupt(signum, frame):
    # Only the user's code is interrupted; an interrupt that arrives while
    # the worker itself answers is dropped.
    global _interrupted
    if _in_cell:
        raise KeyboardInterrupt
    if _taking:
        _interrupted = True


def _send(obj):
    # Lone surrogates (undecodable bytes) become U+FFFD: the line must be
    # valid UTF-8 JSON.
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace") + b"\n"
    view = memoryview(data)
    # A signal can cut a large write short: write the rest.
    while view:
        view = view[_replies.write(view) or 0 :]


def _cut(text, limit):
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "\n[... %d characters omitted ...]\n" % (len(text) - 2 * half) + text[-half:]


def _refresh_venv():
    """Puts the context's virtual environment first on sys.path once it
    exists, and lets imports see packages installed into it since."""
    if not _venv:
        return
    pattern = os.path.join(_venv, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    for path in glob.glob(pattern):
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            continue
        if path not in sys.path:
            site.addsitedir(path)
            sys.path.remove(path)
            sys.path.insert(0, path)
        if _venv_seen.get(path) != mtime:
            _venv_seen[path] = mtime
            importlib.invalidate_caches()


def _is_figure(obj):
    figure = sys.modules.get("matplotlib.figure")
    return figure is not None and isinstance(obj, figure.Figure)


def _bundle(obj, main):
    """The MIME bundle of a value, as IPython's display protocol has it."""
    data = {}
    if not isinstance(obj, type) and not _is_figure(obj):
        bundle = getattr(obj, "_repr_mimebundle_", None)
        if callable(bundle):
            try:
                got = bundle()
                if isinstance(got, tuple):
                    got = got[0]
                for mime, value in (got or {}).items():
                    data[mime] = value
            except Exception:
                pass
        for mime, method in (
            ("text/html", "_repr_html_"),
            ("text/markdown", "_repr_markdown_"),
            ("image/svg+xml", "_repr_svg_"),
            ("image/png", "_repr_png_"),
            ("image/jpeg", "_repr_jpeg_"),
            ("text/latex", "_repr_latex_"),
            ("application/json", "_repr_json_"),
        ):
            if mime in data:
                continue
            fn = getattr(obj, method, None)
            if not callable(fn):
                continue
            try:
                value = fn()
            except Exception:
                continue
            if isinstance(value, tuple):
                value = value[0]
            if value is not None:
                data[mime] = value
    for mime, value in list(data.items()):
        if isinstance(value, bytes):
            data[mime] = base64.b64encode(value).decode()
        elif mime == "application/json" or mime.endswith("+json"):
            try:
                data[mime] = json.dumps(value)
            except (TypeError, ValueError):
                del data[mime]
        elif not isinstance(value, str):
            data[mime] = str(value)
    try:
        data["text/plain"] = _cut(repr(obj), MAX_TEXT)
    except Exception as e:
        data["text/plain"] = "<repr failed: %s: %s>" % (type(e).__name__, e)
    for mime, value in list(data.items()):
        if not mime.startswith("image/") and len(value) > MAX_TEXT:
            data[mime] = _cut(value, MAX_TEXT)
    return {"data": data, "is_main_result": main}


def display(*objs, **kwargs):
    """Shows each value in the run's results, as Jupyter's display() does."""
    for obj in objs:
        if len(_displayed) < MAX_RESULTS:
            _displayed.append(_bundle(obj, False))
        else:
            _dropped[0] += 1


builtins.display = display


def _figures():
    """Every open matplotlib figure as a PNG, then closed (as an inline
    backend does), so the next run starts with none. Interruptible: drawing
    counts as the run's time."""
    global _in_cell
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    out = []
    _in_cell = True
    try:
        _draw(pyplot, out)
    except BaseException as e:
        print("figures not drawn: %s: %s" % (type(e).__name__, e), file=sys.stderr)
    finally:
        _in_cell = False
        try:
            pyplot.close("all")
        except Exception:
            pass
    return out


def _draw(pyplot, out):
    for num in pyplot.get_fignums()[:MAX_RESULTS]:
        fig = pyplot.figure(num)
        try:
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            w, h = fig.get_size_inches() * fig.dpi
            out.append(
                {
                    "data": {
                        "image/png": base64.b64encode(buf.getvalue()).decode(),
                        "text/plain": "<Figure size %dx%d with %d Axes>" % (w, h, len(fig.axes)),
                    },
                    "is_main_result": False,
                }
            )
        except Exception as e:
            print("figure %d could not be drawn: %s: %s" % (num, type(e).__name__, e), file=sys.stderr)


def _describe(exc):
    tb = exc.__traceback__
    # The worker's own frames mean nothing to the caller.
    while tb is not None and tb.tb_frame.f_code.co_filename == WORKER_FILE:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        value = str(exc)
    except Exception:
        value = "<str failed>"
    return {"name": type(exc).__name__, "value": _cut(value, MAX_ERROR), "traceback": _cut(text, MAX_ERROR)}


def _run(code, count):
    global _in_cell
    filename = "<cell %d>" % count
    # Tracebacks show the cell's lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    main = None
    error = None
    try:
        tree = ast.parse(code, filename, "exec")
        last = None
        # A trailing `;` hides the value, as in Jupyter.
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
            last = ast.Expression(tree.body.pop().value)
        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
        body = compile(tree, filename, "exec", flags=flags)
        tail = compile(last, filename, "eval", flags=flags) if last is not None else None
        _in_cell = True
        try:
            if _interrupted:
                raise KeyboardInterrupt
            _await(eval(body, namespace))
            if tail is not None:
                value = _await(eval(tail, namespace))
                if value is not None:
                    namespace["_"] = value
                    main = _bundle(value, True)
        finally:
            _in_cell = False
    except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the context lives on.
        _in_cell = False
        error = _describe(exc)
    return main, error


def _await(value):
    """Runs what a top-level `await` made."""
    if isinstance(value, types.CoroutineType):
        import asyncio

        return asyncio.run(value)
    return value


def _flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


def main():
    os.set_inheritable(3, False)
    os.set_inheritable(4, False)
    signal.signal(signal.SIGINT, _on_interrupt)
    _refresh_venv()
    _send({"ready": True, "pid": os.getpid(), "version": sys.version.split()[0]})
    count = 0
    global _taking, _interrupted
    while True:
        _taking = False
        try:
            line = _in.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            # The daemon is gone: so is the context.
            return
        _taking = True
        _interrupted = False
        request = json.loads(line)
        count += 1
        env = request.get("env") or {}
        saved = {k: os.environ.get(k) for k in env}
        try:
            os.environ.update(env)
        except (ValueError, TypeError) as e:
            print("env not set: %s" % e, file=sys.stderr)
        _refresh_venv()
        del _displayed[:]
        _dropped[0] = 0
        main_result, error = _run(request["code"], count)
        _taking = False
        if os.getpid() != _pid:
            # A fork the code made came back here: it must not answer.
            os._exit(0)
        results = list(_displayed) + _figures()
        if _dropped[0]:
            results.append({"data": {"text/plain": "[%d more displayed values left out]" % _dropped[0]}, "is_main_result": False})
        if main_result is not None:
            results.append(main_result)
        del _displayed[:]
        for k, v in saved.items():
            try:
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            except (ValueError, TypeError):
                pass
        _flush()
        lost = []
        mark = _mark + b"%d." % count
        for fd, name in ((1, "stdout"), (2, "stderr")):
            try:
                os.write(fd, mark)
            except OSError:
                lost.append(name)
        _send({"results": results, "error": error, "lost": lost})


main()
