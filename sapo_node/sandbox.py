"""A sandboxed worker process for computations on untrusted input (scoring completions).

Threat model
------------
The text being scored is written by a language model or received from network peers, so it is
hostile.  The *code* that runs (``fn``, e.g. a ReasoningGym verifier) is trusted, but it may
mishandle that text: ``eval`` it (arbitrary code, ``9**9**9`` burning CPU), recurse on it
until the stack overflows, allocate without bound, print to stdout, or crash the interpreter.
The scoring caller must survive all of that and go on with a score of 0 and a reason.

:class:`Sandbox` runs ``fn`` in a separate, long-lived worker process started with the
``spawn`` method (the parent has torch loaded with threads, so ``fork`` is unsafe) and gives
each call:

* a wall-clock limit (the worker is SIGKILLed on timeout and respawned on the next call);
* an address-space limit (``RLIMIT_AS``, Linux; ``MemoryError`` becomes ``"memory"``),
  no core dumps, a zero file-size limit, and a moderate recursion limit;
* no shared state: arguments and results cross a pipe as pickles; results are unpickled in
  the parent with a restricted unpickler that only builds plain data, so even a compromised
  worker cannot run code in the parent through the result channel;
* a fresh empty working directory, stdout/stderr sent to ``/dev/null`` at the fd level;
* an audit hook (:pep:`578`), armed only while ``fn`` runs, that raises for writes to files,
  file-system changes, process creation, signals, sockets, ``ctypes`` and the compilation or
  execution of source text (``eval``/``exec``/``compile``) except by a small allowlist of
  trusted stdlib modules (imports, ``dataclasses``, ``namedtuple``, ``ast.parse``, ...).  Any
  blocked attempt during a call makes the call's result ``"blocked: <event>"``, even when the
  trusted code swallowed the ``PermissionError`` (so code that writes caches or loads native
  libraries through ``ctypes`` on first use must be imported/run in ``warmup``, before the
  hook is installed).

Audit hooks are a tripwire against *text* turning into actions, not a boundary against code
that already runs in the worker (such code could tamper with the hook's state); the process
boundary, the resource limits and the timeout are what contain the rest.  Verifiers that
``eval`` the answer should be replaced anyway (see :mod:`sapo_node.safe_verifiers`).

Callers should pass bounded input; calls whose pickled arguments exceed
``SandboxLimits.max_input_bytes`` are refused with ``"input too large"``.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import structlog

__all__ = [
    "DEFAULT_COMPILE_ALLOWLIST",
    "CallResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxViolation",
]

log = structlog.get_logger(__name__)

DEFAULT_COMPILE_ALLOWLIST: frozenset[str] = frozenset(
    {
        "importlib._bootstrap",  # lazy imports: exec of module code
        "importlib._bootstrap_external",  # lazy imports: compile of .py sources
        "zipimport",  # imports from zip files
        "ast",  # ast.parse / ast.literal_eval (parse only, nothing runs)
        "dataclasses",  # generated __init__/__repr__/__eq__
        "collections",  # namedtuple's generated __new__
        "typing",  # forward references in annotations
    }
)
"""Modules (``__name__`` of the calling frame) allowed to compile/exec source while armed."""

_COMPILE_EVENTS = frozenset({"compile", "exec", "marshal.loads", "marshal.load"})
"""Audit events that turn data into code; subject to ``compile_allowed_from``."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits applied to each call and to the worker process.

    Attributes:
        timeout_s: wall-clock seconds per call; on expiry the worker is killed.
        memory_mb: address space (``RLIMIT_AS``) the worker may add to what it maps after
            start-up and ``warmup`` (Linux only; ignored where unsupported).  Relative rather
            than absolute because the interpreter, the re-imported ``__main__`` of the parent
            and the warmed-up libraries already map a machine-dependent amount.
        max_input_bytes: largest pickled argument tuple accepted by :meth:`Sandbox.call`.
        startup_timeout_s: seconds allowed for spawning the worker and running ``warmup``.
        recursion_limit: ``sys.setrecursionlimit`` in the worker.
        compile_allowed_from: modules allowed to compile/exec source text (or unmarshal code)
            during a call, matched against ``__name__`` of the calling frame; an entry ending
            in ``"."`` allows a whole package.  Allowing a module whose code evaluates answer
            text (``sympy.parse_expr``) lets that text run as code; do so only for vetted
            text, as :mod:`sapo_node.safe_verifiers` does (see its
            ``TRUSTED_COMPILE_CALLERS``).
    """

    timeout_s: float = 2.0
    memory_mb: int = 1024
    max_input_bytes: int = 4 << 20
    startup_timeout_s: float = 60.0
    recursion_limit: int = 1000
    compile_allowed_from: frozenset[str] = DEFAULT_COMPILE_ALLOWLIST


@dataclass(frozen=True)
class CallResult:
    """Outcome of one sandboxed call.

    Attributes:
        value: the return value of ``fn`` when the call succeeded, else None.
        error: None on success, else a short reason: ``"timeout"``, ``"memory"``,
            ``"crashed (exit code N)"``, ``"exception: ValueError: ..."``,
            ``"blocked: open('x', 'w')"``, ``"input too large"``, ``"startup failed: ..."``.
    """

    value: Any | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the call returned normally."""
        return self.error is None


class SandboxViolation(PermissionError):
    """Raised inside the worker by the audit hook for a blocked action."""


# --------------------------------------------------------------------------------------------
# Worker side (runs in the spawned process)
# --------------------------------------------------------------------------------------------

_BLOCKED_EVENTS: frozenset[str] = frozenset(
    {
        "os.system",
        "os.kill",
        "os.killpg",
        "os.remove",
        "os.rename",
        "os.mkdir",
        "os.rmdir",
        "os.truncate",
        "os.chmod",
        "os.chown",
        "os.chflags",
        "os.lchflags",
        "os.link",
        "os.symlink",
        "os.utime",
        "os.setxattr",
        "os.removexattr",
        "os.startfile",
        "os.lockf",
        "pty.spawn",
        "resource.setrlimit",
        "resource.prlimit",
        "signal.pthread_kill",
        "pickle.find_class",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "webbrowser.open",
        "urllib.Request",
    }
)
"""Audit events always blocked while armed."""

_BLOCKED_PREFIXES: tuple[str, ...] = (
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "os.fork",
    "shutil.",
    "subprocess.",
    "socket.",
    "ctypes.",
    "sqlite3.",
    "tempfile.",
    "syslog.",
    "http.client.",
    "ftplib.",
    "smtplib.",
    "poplib.",
    "imaplib.",
    "nntplib.",
    "telnetlib.",
    "winreg.",
    "msvcrt.",
    "_winapi.",
)
"""Families of audit events blocked while armed."""

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

_armed = False
_hook_state = threading.local()  # .busy: this thread is inside the hook (re-entrant events)
_violations: list[str] = []
_compile_allowed: frozenset[str] = frozenset()
_compile_allowed_prefixes: tuple[str, ...] = ()


def _short(obj: Any, limit: int = 60) -> str:
    """A repr of ``obj`` cut to ``limit`` characters."""
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_event(event: str, args: tuple[Any, ...]) -> str:
    """A short human-readable description of an audit event."""
    if event == "open" and len(args) >= 3:
        path, mode, flags = args[:3]
        how = _short(mode) if mode is not None else f"flags={_short(flags)}"
        return f"open({_short(path)}, {how})"
    if event == "compile" and args:
        return f"compile({_short(args[0])})"
    if args:
        return f"{event}({_short(args[0])})"
    return event


def _is_write_open(args: tuple[Any, ...]) -> bool:
    """Whether an ``open`` audit event (path, mode, flags) opens for writing or creating."""
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 else None
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _caller_module() -> str | None:
    """``__name__`` of the Python frame that called the audited builtin."""
    try:
        frame = sys._getframe(3)  # 0: here, 1: _is_blocked, 2: _audit_hook, 3: the caller
    except ValueError:
        return None
    return frame.f_globals.get("__name__")


def _is_blocked(event: str, args: tuple[Any, ...]) -> bool:
    """The audit policy while armed."""
    if event == "open":
        return _is_write_open(args)
    if event in _COMPILE_EVENTS:
        module = _caller_module()
        if module is None:
            return True
        return module not in _compile_allowed and not module.startswith(_compile_allowed_prefixes)
    return event in _BLOCKED_EVENTS or event.startswith(_BLOCKED_PREFIXES)


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    """Audit hook installed in the worker; raises :class:`SandboxViolation` when armed."""
    if not _armed or getattr(_hook_state, "busy", False):
        return
    _hook_state.busy = True  # events raised by the hook itself (sys._getframe, repr) pass
    try:
        if not _is_blocked(event, args):
            return
        reason = _describe_event(event, args)
        _violations.append(reason)
    finally:
        _hook_state.busy = False
    raise SandboxViolation(f"blocked: {reason}")


def _describe_exception(exc: BaseException, limit: int = 300) -> str:
    """``"TypeName: message"`` cut to ``limit`` characters."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _watch_parent(parent_pid: int, workdir: str) -> None:
    """Exit the worker as soon as its parent is gone (even if ``fn`` is spinning)."""
    global _armed
    tick = threading.Event()  # Event.wait raises no audit events, unlike time.sleep
    while os.getppid() == parent_pid:
        tick.wait(0.5)
    _armed = False  # the parent cannot clean up any more: remove the working directory
    shutil.rmtree(workdir, ignore_errors=True)
    os._exit(0)


def _silence_stdio() -> None:
    """Point fds 1 and 2 at /dev/null (verifiers such as bf print to stdout)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    finally:
        os.close(devnull)


def _mapped_bytes() -> int | None:
    """Current virtual memory size of this process (Linux), else None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _set_rlimits(limits: SandboxLimits) -> None:
    """Apply the resource limits of the worker where the platform supports them."""
    try:
        import resource
    except ImportError:  # not POSIX
        return

    def set_limit(name: str, value: int) -> None:
        which = getattr(resource, name, None)
        if which is None:
            return
        with contextlib.suppress(ValueError, OSError):
            _soft, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, value))

    set_limit("RLIMIT_CORE", 0)
    if sys.platform.startswith("linux"):
        mapped = _mapped_bytes()
        if mapped is not None:
            set_limit("RLIMIT_AS", mapped + (limits.memory_mb << 20))
    if hasattr(signal, "SIGXFSZ"):  # writes past the limit fail with EFBIG instead of killing
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        set_limit("RLIMIT_FSIZE", 0)


def _plain(value: Any) -> Any:
    """Convert a numpy scalar result to the Python scalar it holds."""
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    return value


def _send(conn: Connection, message: tuple[str, Any]) -> None:
    """Send a (kind, payload) message to the parent."""
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        reason = f"unpicklable result: {_describe_exception(exc)}"
        data = pickle.dumps(("error", reason), protocol=pickle.HIGHEST_PROTOCOL)
    conn.send_bytes(data)


def _run_one(fn: Callable[..., Any], request: bytes) -> tuple[str, Any]:
    """Run one request with the audit hook armed; returns the message for the parent."""
    global _armed
    try:
        args = pickle.loads(request)
    except Exception as exc:
        return ("error", f"bad request: {_describe_exception(exc)}")
    _violations.clear()
    outcome: tuple[str, Any]
    _armed = True
    try:
        outcome = ("ok", _plain(fn(*args)))
    except MemoryError:
        outcome = ("error", "memory")
    except BaseException as exc:  # SystemExit/KeyboardInterrupt from fn are results too
        outcome = ("error", f"exception: {_describe_exception(exc)}")
    finally:
        _armed = False
    if _violations:
        return ("error", f"blocked: {_violations[0]}")
    return outcome


def _worker_main(
    conn: Connection,
    fn: Callable[..., Any],
    warmup: Callable[[], None] | None,
    limits: SandboxLimits,
    workdir: str,
    parent_pid: int,
) -> None:
    """Entry point of the worker process: set up the jail, then serve requests until EOF."""
    global _compile_allowed, _compile_allowed_prefixes
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    threading.Thread(target=_watch_parent, args=(parent_pid, workdir), daemon=True).start()
    try:
        _silence_stdio()
        os.chdir(workdir)
        sys.dont_write_bytecode = True
        if warmup is not None:
            warmup()
        _set_rlimits(limits)
        sys.setrecursionlimit(limits.recursion_limit)
        _compile_allowed = frozenset(limits.compile_allowed_from)
        _compile_allowed_prefixes = tuple(m for m in _compile_allowed if m.endswith("."))
        sys.addaudithook(_audit_hook)
    except BaseException as exc:
        _send(conn, ("error", f"startup failed: {_describe_exception(exc)}"))
        return
    _send(conn, ("ready", None))
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):  # parent closed the pipe or died
            # A parent that died cannot remove the working directory; one that closed the
            # pipe removes it too (both ignore errors), so remove it on every way out.
            shutil.rmtree(workdir, ignore_errors=True)
            return
        _send(conn, _run_one(fn, request))


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------

_SAFE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("builtins", "complex"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytearray"),
        ("builtins", "slice"),
        ("builtins", "range"),
    }
)


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickler that builds plain data only (no arbitrary classes or callables)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"result refers to {module}.{name}")


def _decode(data: bytes) -> tuple[str, Any]:
    """Unpickle a worker message with :class:`_PlainDataUnpickler`."""
    message = _PlainDataUnpickler(io.BytesIO(data)).load()
    if not (isinstance(message, tuple) and len(message) == 2 and isinstance(message[0], str)):
        raise pickle.UnpicklingError("malformed message")
    return message


def _stop_worker(process: BaseProcess, conn: Connection, workdir: str, grace_s: float) -> None:
    """Close the pipe, give the worker ``grace_s`` to exit, then SIGKILL and reap it."""
    with contextlib.suppress(OSError):
        conn.close()
    if grace_s > 0:
        process.join(grace_s)
    if process.is_alive():
        process.kill()
        process.join(5.0)
    shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    workdir: str
    finalizer: weakref.finalize


class Sandbox:
    """Runs ``fn(*args)`` in a sandboxed, long-lived worker process.

    The worker is spawned lazily on the first call (importing ReasoningGym in ``warmup`` costs
    seconds, so it is kept between calls) and respawned on the call after a timeout or crash.
    Calls are serialised (thread-safe); :meth:`close` or leaving a ``with`` block ends the
    worker, and a worker never outlives its parent.  As with any ``spawn`` start method, the
    parent's ``__main__`` module is re-imported in the worker, so scripts need an
    ``if __name__ == "__main__":`` guard.

    Args:
        fn: a module-level function (pickled by reference) run in the worker; its results
            must be plain data (None, bool, int, float, complex, str, bytes, and lists,
            tuples, dicts and sets of those; numpy scalars are converted).
        limits: see :class:`SandboxLimits`.
        warmup: an optional module-level function run once in each new worker before the
            audit hook is installed: import there the libraries ``fn`` needs (a lazy import
            during a call works for plain Python modules, but one that loads native code
            through ``ctypes`` is blocked).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        limits: SandboxLimits | None = None,
        warmup: Callable[[], None] | None = None,
    ) -> None:
        for name, obj in (("fn", fn), ("warmup", warmup)):
            if obj is None:
                continue
            try:
                pickle.dumps(obj)
            except Exception as exc:
                raise TypeError(f"{name} must be a module-level function: {exc}") from exc
        self._fn = fn
        self._warmup = warmup
        self.limits = limits if limits is not None else SandboxLimits()
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._closed = False

    # -- public API --------------------------------------------------------------------------

    def call(self, *args: Any) -> CallResult:
        """Run ``fn(*args)`` in the worker; never raises for anything ``fn`` does.

        Raises:
            RuntimeError: if the sandbox is closed.
        """
        try:
            payload = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            return CallResult(error=f"unpicklable input: {_describe_exception(exc)}")
        if len(payload) > self.limits.max_input_bytes:
            return CallResult(error="input too large")
        with self._lock:
            if self._closed:
                raise RuntimeError("Sandbox is closed")
            return self._call_locked(payload)

    def map(self, args_list: Sequence[tuple[Any, ...]]) -> list[CallResult]:
        """Call ``fn(*args)`` for each tuple in order; a timeout or crash only fails its item."""
        return [self.call(*args) for args in args_list]

    def close(self) -> None:
        """Stop the worker (idempotent); the sandbox cannot be used afterwards."""
        with self._lock:
            self._closed = True
            self._discard(grace_s=1.0)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _call_locked(self, payload: bytes) -> CallResult:
        worker = self._worker
        if worker is None or not worker.process.is_alive():
            self._discard(grace_s=0.0)
            error = self._start()
            if error is not None:
                return CallResult(error=error)
            worker = self._worker
            assert worker is not None
        try:
            worker.conn.send_bytes(payload)
        except (OSError, ValueError):
            code = self._discard(grace_s=1.0)
            return CallResult(error=f"crashed (exit code {code})")
        if not worker.conn.poll(self.limits.timeout_s):
            self._discard(grace_s=0.0)
            log.warning("sandbox_timeout", fn=_qualname(self._fn), timeout_s=self.limits.timeout_s)
            return CallResult(error="timeout")
        try:
            kind, value = _decode(worker.conn.recv_bytes())
        except (EOFError, OSError):
            code = self._discard(grace_s=1.0)
            log.warning("sandbox_crash", fn=_qualname(self._fn), exit_code=code)
            return CallResult(error=f"crashed (exit code {code})")
        except Exception as exc:  # a worker sending anything but plain data is not trusted
            self._discard(grace_s=0.0)
            return CallResult(error=f"bad result: {_describe_exception(exc)}")
        if kind == "ok":
            return CallResult(value=value)
        return CallResult(error=str(value))

    def _start(self) -> str | None:
        """Spawn a worker and wait for it to be ready; returns an error reason or None."""
        workdir = tempfile.mkdtemp(prefix="sapo-sandbox-")
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, self._fn, self._warmup, self.limits, workdir, os.getpid()),
            name="sapo-sandbox",
            daemon=True,
        )
        try:
            process.start()
        except Exception as exc:
            parent_conn.close()
            shutil.rmtree(workdir, ignore_errors=True)
            return f"startup failed: {_describe_exception(exc)}"
        finally:
            child_conn.close()
        finalizer = weakref.finalize(self, _stop_worker, process, parent_conn, workdir, 0.0)
        self._worker = _Worker(process, parent_conn, workdir, finalizer)
        if not parent_conn.poll(self.limits.startup_timeout_s):
            self._discard(grace_s=0.0)
            return "startup failed: timeout"
        try:
            kind, value = _decode(parent_conn.recv_bytes())
        except (EOFError, OSError):
            code = self._discard(grace_s=1.0)
            return f"startup failed: crashed (exit code {code})"
        except Exception as exc:
            self._discard(grace_s=0.0)
            return f"startup failed: bad message: {_describe_exception(exc)}"
        if kind != "ready":
            self._discard(grace_s=1.0)
            return str(value)
        return None

    def _discard(self, grace_s: float) -> int | None:
        """Stop and forget the current worker, if any; returns its exit code."""
        worker, self._worker = self._worker, None
        if worker is None:
            return None
        worker.finalizer.detach()
        _stop_worker(worker.process, worker.conn, worker.workdir, grace_s)
        return worker.process.exitcode


def _qualname(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function, for logs."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
