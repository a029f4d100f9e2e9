"""Crash isolation: run one call in a child process with a wall-clock and memory limit.

MLIR transforms and JIT-compiled code can segfault, abort, hang or eat all memory; run in a
child, such a failure becomes an :class:`~stagegraph.errors.IsolatedFailure` with a reason
instead of killing the tuner or the CLI. Children come from a ``forkserver`` (never a plain
``fork`` of the parent, whose MLIR bindings hold threads); the server preloads
:mod:`stagegraph.mlir.bindings`, so a child starts with the bindings already imported.

Neither the server nor a child imports the caller's ``__main__`` unless the call needs it
(``fn`` or an argument defined there). multiprocessing would otherwise run the main script
again in each of them, and a script without an ``if __name__ == "__main__":`` guard (a
tuning script calling ``stagegraph.tune``) would start its whole run again inside the
server, where starting processes is refused: every candidate failed. What the children
must know by name (plugins) reaches them through the request instead.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import multiprocessing
import os
import pickle
import re
import resource
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field

from stagegraph.core.ports import Schema
from stagegraph.errors import IsolatedFailure, StagegraphError, restore_exception

T = TypeVar("T")

PRELOAD = ("stagegraph.app.child_process", "stagegraph.mlir.bindings")
_GRACE_S = 5  # the child's own alarm fires this long after the parent's deadline
_TAIL_CHARS = 4000
_OOM = re.compile(r"bad_alloc|out of memory|Cannot allocate memory|MemoryError", re.IGNORECASE)


class Limits(Schema):
    """Limits of one isolated call (the CLI's ``--isolate``)."""

    timeout_s: float = Field(300.0, gt=0, description="wall-clock limit, enforced by the parent")
    memory_bytes: int | None = Field(
        8 * 2**30, gt=0, description="RLIMIT_AS of the child (address space); None: unlimited"
    )

    def run(self, fn: Callable[..., T], *args: Any, label: str = "") -> T:
        """:func:`run_isolated` with these limits."""
        return run_isolated(
            fn, *args, timeout_s=self.timeout_s, memory_bytes=self.memory_bytes, label=label
        )


def _context() -> multiprocessing.context.BaseContext:
    _install_main_filter()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # no effect once the server runs
    return context


_without_main = threading.local()
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")


def _install_main_filter() -> None:
    """Let :func:`run_isolated` start a child that does not re-run ``__main__``.

    multiprocessing asks ``spawn.get_preparation_data`` what a new child must import
    first, the main module included; the wrapper drops the main module while the current
    thread starts a child whose call does not refer to ``__main__`` (a thread-local flag,
    so other threads and other users of multiprocessing are unaffected).
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data
    if getattr(original, "_stagegraph_filter", False):
        return

    def preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if getattr(_without_main, "active", False):
            for key in _MAIN_KEYS:
                data.pop(key, None)
        return data

    preparation_data._stagegraph_filter = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = preparation_data


@contextlib.contextmanager
def _main_skipped(payload: bytes) -> Any:
    """While starting a child for ``payload``: skip ``__main__`` unless the payload uses it."""
    _without_main.active = b"__main__" not in payload
    try:
        yield
    finally:
        _without_main.active = False


def run_isolated(
    fn: Callable[..., T],
    *args: Any,
    timeout_s: float,
    memory_bytes: int | None,
    label: str = "",
) -> T:
    """Call ``fn(*args)`` in a child process and return its result.

    ``fn``, ``args`` and the result must be picklable (``fn`` a top-level function). The
    child gets its own process group (killed as a whole on timeout), ``RLIMIT_AS`` =
    ``memory_bytes``, and its fd 2 redirected to a file whose tail goes into the error.

    Raises:
        StagegraphError: the child raised one; re-raised as the same class and message,
            chained (``__cause__``) to an ``IsolatedFailure`` with the child's traceback.
        IsolatedFailure: ``reason`` is ``"signal"``, ``"timeout"``, ``"memory"``,
            ``"exception"`` or ``"exit"``.
    """
    payload = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    with tempfile.TemporaryDirectory(prefix="stagegraph-isolate-") as tmp:
        work = Path(tmp)
        process = _context().Process(
            target=_child,
            args=(payload, memory_bytes, timeout_s, tmp),
            name=f"stagegraph-isolate {label}".strip(),
        )
        with _main_skipped(payload):
            process.start()
        timed_out = True
        try:
            process.join(timeout_s)
            timed_out = process.exitcode is None
        finally:
            code = _kill_group(process)
        stderr = _tail(work / "stderr")
        result = work / "result"
        if result.exists():
            status, value = pickle.loads(result.read_bytes())
            if status == "ok":
                return value
            raise _from_exception(value, label, memory_bytes, stderr)
        common = {"label": label, "exitcode": code, "stderr_tail": stderr}
        if timed_out:
            detail = f"timed out after {timeout_s:g} s; the child's process group was killed"
            raise IsolatedFailure("timeout", detail, timeout_s=timeout_s, **common)
        return _raise_for_exit(code, timeout_s, memory_bytes, common)


def _kill_group(process: multiprocessing.process.BaseProcess) -> int | None:
    """SIGKILL the child's process group (grandchildren too), reap the child, its exit code."""
    if process.pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # ESRCH if the child had not set it up yet
    if process.exitcode is None:
        process.kill()
    process.join()
    code = process.exitcode
    process.close()
    return code


def _raise_for_exit(
    code: int | None, timeout_s: float, memory_bytes: int | None, common: dict[str, Any]
) -> Any:
    """Classify a child that ended without writing a result."""
    if code is None or code >= 0:
        raise IsolatedFailure("exit", f"the child exited with code {code} and no result", **common)
    number = -code
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    what = signal.strsignal(number) or name
    if number == signal.SIGALRM:
        detail = f"timed out (the child's own alarm, {timeout_s:g} s + {_GRACE_S} s)"
        raise IsolatedFailure("timeout", detail, signal=name, timeout_s=timeout_s, **common)
    if _OOM.search(common["stderr_tail"]) or number == signal.SIGKILL:
        cause = "killed by SIGKILL (the OOM killer?)" if number == signal.SIGKILL else name
        detail = f"ran out of memory ({cause}; limit {_size(memory_bytes)})"
        raise IsolatedFailure("memory", detail, signal=name, memory_bytes=memory_bytes, **common)
    raise IsolatedFailure("signal", f"killed by {name} ({what})", signal=name, **common)


def _from_exception(
    info: dict[str, Any], label: str, memory_bytes: int | None, stderr: str
) -> BaseException:
    """The parent-side error for an exception the child caught."""
    memory = info["type"] == "MemoryError"
    reason = "memory" if memory else "exception"
    detail = f"{info['type']}: {info['message']}"
    if memory:
        detail = f"ran out of memory (MemoryError; limit {_size(memory_bytes)})"
    failure = IsolatedFailure(
        reason,
        detail,
        label=label,
        memory_bytes=memory_bytes,
        exc_type=info["type"],
        exc_message=info["message"],
        child_traceback=info["traceback"],
        stderr_tail=stderr,
    )
    failure.add_note("child traceback:\n" + info["traceback"].rstrip())
    if info["rebuild"] is not None:
        with contextlib.suppress(Exception):
            original = restore_exception(*pickle.loads(info["rebuild"]))
            original.__cause__ = failure
            return original
    return failure


def _size(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**30:.3g} GiB"


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - _TAIL_CHARS))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# -- the child ----------------------------------------------------------------------------


def _child(payload: bytes, memory_bytes: int | None, timeout_s: float, work: str) -> None:
    """Child entry: set up the sandbox, run the call, write ("ok"|"error", value) to a file."""
    os.setpgid(0, 0)
    _die_with_server()
    signal.alarm(math.ceil(timeout_s) + _GRACE_S)  # backstop should the parent be gone
    sys.stderr.flush()
    fd = os.open(os.path.join(work, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()
    if memory_bytes is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    try:
        fn, args = pickle.loads(payload)
        data = pickle.dumps(("ok", fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # everything, SystemExit and KeyboardInterrupt included
        data = pickle.dumps(("error", _describe(exc)))
    Path(work, "result.tmp").write_bytes(data)
    os.replace(os.path.join(work, "result.tmp"), os.path.join(work, "result"))
    sys.stderr.flush()


def _describe(exc: BaseException) -> dict[str, Any]:
    """Type, message, traceback text and (for StagegraphError) a pickle that round-trips."""
    traceback.clear_frames(exc.__traceback__)  # free the locals first: MemoryError needs room
    try:
        text = "".join(traceback.format_exception(exc))
    except MemoryError:
        text = ""
    rebuild = None
    if isinstance(exc, StagegraphError):
        try:
            rebuild = pickle.dumps((type(exc), exc.args, dict(exc.__dict__)))
            restore_exception(*pickle.loads(rebuild))
        except Exception:
            rebuild = None
    try:
        message = str(exc)
    except Exception:
        message = repr(exc)
    kind = type(exc).__qualname__
    if type(exc).__module__ != "builtins":
        kind = f"{type(exc).__module__}.{kind}"
    return {"type": kind, "message": message, "traceback": text, "rebuild": rebuild}


def _die_with_server() -> None:
    """Linux: SIGKILL this child when the fork server exits (it does when the caller dies).

    The server exits once every holder of the caller's "alive" pipe is gone, and every child
    inherits that pipe; so drop it here (a nested call then starts its own server).
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    with contextlib.suppress(AttributeError, OSError, TypeError):
        os.close(server._forkserver_alive_fd)
    server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the server is already gone
        os._exit(1)


__all__ = ["PRELOAD", "IsolatedFailure", "Limits", "run_isolated"]
