"""Tests of the sandboxed worker pool (sapo_node.sandbox).

The helper functions at module level run inside the spawned worker: the worker imports this
module by name (spawn hands the parent's ``sys.path`` to the child), and a single
:func:`dispatch` entry point lets one warm worker serve most tests.
"""

from __future__ import annotations

import collections
import dataclasses
import faulthandler
import multiprocessing
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from sapo_node import sandbox as sandbox_module
from sapo_node.sandbox import CallResult, Sandbox, SandboxLimits

TIMEOUT_S = 1.0

# --------------------------------------------------------------------------------------------
# Helpers run in the worker
# --------------------------------------------------------------------------------------------


def echo(value: Any) -> Any:
    return value


def fail() -> None:
    raise ValueError("bad input")


def hang() -> None:
    while True:
        pass


def exit3() -> None:
    os._exit(3)


def segfault() -> None:
    faulthandler._sigsegv()


def allocate_4gb() -> int:
    return len(bytearray(4 << 30))


def recurse(depth: int = 0) -> int:
    return recurse(depth + 1)


def chatty() -> str:
    for _ in range(2000):
        print("+" * 100)
        print("-" * 100, file=sys.stderr)
    os.write(1, b"raw bytes on fd 1\n")
    return "still fine"


def legit_work(path: str) -> list[Any]:
    """Things trusted verifier code does: read files, lazy imports, dataclasses, namedtuples,
    ast.literal_eval."""
    import ast
    import importlib

    with open(path, encoding="utf-8") as f:
        text = f.read()
    colorsys = importlib.import_module("colorsys")
    point = dataclasses.make_dataclass("Point", ["x", "y"])(1, 2)
    pair = collections.namedtuple("Pair", "a b")(3, 4)
    return [text, colorsys.__name__, point.x, pair.b, ast.literal_eval("[1, (2, 3)]")]


def numpy_scalar() -> Any:
    return np.float64(0.5)  # numpy was imported with this module, before the guard


def fraction() -> Fraction:
    return Fraction(1, 2)


def cwd_listing() -> list[str]:
    return sorted(os.listdir("."))


# Attacks: each gets a directory of the test's tmp_path to aim at.


def attack_open_write(target: str) -> None:
    open(os.path.join(target, "pwned.txt"), "w").close()


def attack_open_write_relative(target: str) -> None:
    with open("pwned.txt", "w") as f:
        f.write("x")


def attack_open_append(target: str) -> None:
    open(os.path.join(target, "pwned.txt"), "a").close()


def attack_os_open_creat(target: str) -> None:
    os.close(os.open(os.path.join(target, "pwned.txt"), os.O_WRONLY | os.O_CREAT))


def attack_pathlib_write(target: str) -> None:
    Path(target, "pwned.txt").write_text("x")


def attack_os_system(target: str) -> None:
    os.system(f"touch {target}/pwned.txt")


def attack_subprocess(target: str) -> None:
    subprocess.run(["touch", os.path.join(target, "pwned.txt")], check=False)


def attack_eval(target: str) -> Any:
    return eval("1+1")


def attack_eval_payload(target: str) -> Any:
    return eval(f"__import__('os').system('touch {target}/pwned.txt')")


def attack_exec(target: str) -> None:
    exec(f"open({os.path.join(target, 'pwned.txt')!r}, 'w')")


def attack_compile(target: str) -> Any:
    return compile("1", "<x>", "eval")


def attack_remove(target: str) -> None:
    os.remove(os.path.join(target, "keep.txt"))


def attack_rename(target: str) -> None:
    os.rename(os.path.join(target, "keep.txt"), os.path.join(target, "pwned.txt"))


def attack_mkdir(target: str) -> None:
    os.mkdir(os.path.join(target, "pwned"))


def attack_rmtree(target: str) -> None:
    import shutil

    shutil.rmtree(target)


def attack_copy(target: str) -> None:
    import shutil

    shutil.copyfile(os.path.join(target, "keep.txt"), os.path.join(target, "pwned.txt"))


def attack_tempfile(target: str) -> None:
    tempfile.mkstemp(dir=target)


def attack_fork(target: str) -> None:
    if os.fork() == 0:
        os._exit(0)


def attack_exec_program(target: str) -> None:
    os.execv("/usr/bin/touch", ["touch", os.path.join(target, "pwned.txt")])


def attack_kill(target: str) -> None:
    os.kill(os.getppid(), 0)


def attack_ctypes(target: str) -> None:
    import ctypes

    ctypes.CDLL(None).system(f"touch {target}/pwned.txt".encode())


def attack_pickle(target: str) -> None:
    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {target}/pwned.txt",))

    pickle.loads(pickle.dumps(Exploit()))


def attack_socket(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        pass


def attack_swallowed(target: str) -> str:
    try:
        open(os.path.join(target, "pwned.txt"), "w").close()
    except Exception:
        return "verifier swallowed it"
    return "written"


def dispatch(name: str, *args: Any) -> Any:
    """The sandboxed entry point: runs the helper called ``name``."""
    return globals()[name](*args)


def failing_warmup() -> None:
    raise RuntimeError("no such library")


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with Sandbox(dispatch, SandboxLimits(timeout_s=TIMEOUT_S)) as sandbox:
        yield sandbox


@pytest.mark.parametrize(
    "value",
    [0, -3, 1.5, "text", None, True, [1, [2, "x"]], {"a": (1, 2)}, {1, 2}, 1 + 2j, b"\x00"],
)
def test_round_trip(box: Sandbox, value: Any) -> None:
    assert box.call("echo", value) == CallResult(value=value, error=None)


def test_exception_is_reported_with_type(box: Sandbox) -> None:
    result = box.call("fail")
    assert not result.ok
    assert result.value is None
    assert result.error == "exception: ValueError: bad input"


def test_timeout_kills_and_next_call_works(box: Sandbox) -> None:
    box.call("echo", 0)  # worker warm, so the timing below is the call's alone
    start = time.monotonic()
    result = box.call("hang")
    elapsed = time.monotonic() - start
    assert result.error == "timeout"
    assert elapsed < TIMEOUT_S + 10.0  # bounded (generous: CI machines are noisy)
    assert box.call("echo", 1).value == 1


def test_exit_is_a_crash_and_next_call_works(box: Sandbox) -> None:
    assert box.call("exit3").error == "crashed (exit code 3)"
    assert box.call("echo", 2).value == 2


def test_segfault_is_a_crash(box: Sandbox) -> None:
    assert box.call("segfault").error == f"crashed (exit code {-signal.SIGSEGV})"
    assert box.call("echo", 3).value == 3


def test_memory_limit(box: Sandbox) -> None:
    result = box.call("allocate_4gb")
    if sys.platform.startswith("linux"):
        assert result.error == "memory"
    else:  # no RLIMIT_AS: the allocation may succeed
        assert result.error in (None, "memory") or result.error.startswith("crashed")
    assert box.call("echo", 4).value == 4


def test_recursion_is_an_exception(box: Sandbox) -> None:
    result = box.call("recurse")
    assert result.error is not None
    assert result.error.startswith("exception: RecursionError")


def test_printing_does_not_break_the_protocol(box: Sandbox) -> None:
    assert box.call("chatty").value == "still fine"


def test_legit_work_is_allowed(box: Sandbox, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("hello", encoding="utf-8")
    assert box.call("legit_work", str(data)).value == ["hello", "colorsys", 1, 4, [1, (2, 3)]]


def test_results_are_plain_data(box: Sandbox) -> None:
    assert box.call("numpy_scalar") == CallResult(value=0.5)
    result = box.call("fraction")
    assert result.error is not None
    assert result.error.startswith("bad result:")
    assert box.call("echo", 5).value == 5


@pytest.mark.parametrize(
    ("attack", "event"),
    [
        ("attack_open_write", "open("),
        ("attack_open_write_relative", "open('pwned.txt', 'w')"),
        ("attack_open_append", "open("),
        ("attack_os_open_creat", "open("),
        ("attack_pathlib_write", "open("),
        ("attack_os_system", "os.system"),
        ("attack_subprocess", "subprocess.Popen"),
        ("attack_eval", "compile"),
        ("attack_eval_payload", "compile"),
        ("attack_exec", "compile"),
        ("attack_compile", "compile"),
        ("attack_remove", "os.remove"),
        ("attack_rename", "os.rename"),
        ("attack_mkdir", "os.mkdir"),
        ("attack_rmtree", "shutil.rmtree"),
        ("attack_copy", "shutil.copyfile"),
        ("attack_tempfile", "tempfile.mkstemp"),
        ("attack_fork", "os.fork"),
        ("attack_exec_program", "os.exec"),
        ("attack_kill", "os.kill"),
        ("attack_ctypes", "ctypes."),
        ("attack_pickle", "pickle.find_class"),
        ("attack_swallowed", "open("),
    ],
)
def test_attack_is_blocked(box: Sandbox, tmp_path: Path, attack: str, event: str) -> None:
    keep = tmp_path / "keep.txt"
    keep.write_text("precious", encoding="utf-8")
    cwd_before = sorted(os.listdir("."))

    result = box.call("dispatch", attack, str(tmp_path))

    assert result.value is None
    assert result.error is not None
    assert result.error.startswith(f"blocked: {event}"), result.error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert keep.read_text(encoding="utf-8") == "precious"
    assert sorted(os.listdir(".")) == cwd_before
    assert box.call("cwd_listing").value == []  # the worker's own directory stays empty


def test_socket_connect_is_blocked(box: Sandbox) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.3)
        result = box.call("attack_socket", server.getsockname()[1])
        assert result.error is not None
        assert result.error.startswith("blocked: socket.")
        with pytest.raises(TimeoutError):
            server.accept()


def test_map_scores_items_after_a_timeout(box: Sandbox) -> None:
    results = box.map([("echo", "a"), ("hang",), ("echo", "b")])
    assert [r.value for r in results] == ["a", None, "b"]
    assert [r.error for r in results] == [None, "timeout", None]


def test_input_too_large_is_refused() -> None:
    sandbox = Sandbox(echo, SandboxLimits(max_input_bytes=1000))
    try:
        assert sandbox.call("x" * 2000) == CallResult(error="input too large")
        assert sandbox._worker is None  # refused before any worker was spawned
    finally:
        sandbox.close()


def test_fn_must_be_picklable() -> None:
    with pytest.raises(TypeError):
        Sandbox(lambda: None)


def test_startup_failure_is_reported() -> None:
    with Sandbox(echo, warmup=failing_warmup) as sandbox:
        result = sandbox.call(1)
    assert result.error == "startup failed: RuntimeError: no such library"


def test_close_leaves_no_child_and_is_idempotent() -> None:
    sandbox = Sandbox(echo)
    assert sandbox.call(1).value == 1
    worker = sandbox._worker
    assert worker is not None
    pid = worker.process.pid
    assert psutil.pid_exists(pid)
    sandbox.close()
    sandbox.close()
    assert not any(p.pid == pid for p in multiprocessing.active_children())
    assert not _running(pid)
    assert not os.path.exists(worker.workdir)
    with pytest.raises(RuntimeError):
        sandbox.call(2)


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
def test_worker_dies_with_its_parent(tmp_path: Path, busy: bool) -> None:
    """A parent killed with SIGKILL (no cleanup at all) must not leave its worker running,
    nor its working directory: whether the worker is spinning in a call (its watcher thread
    notices) or idle, waiting for a request (it reads end-of-file first)."""
    script = tmp_path / "parent.py"
    # A request written before the pid is printed is read before the pipe's end-of-file.
    send = 'sandbox._worker.conn.send_bytes(__import__("pickle").dumps(()))' if busy else "pass"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            from sapo_node.sandbox import Sandbox
            from test_sandbox import hang

            if __name__ == "__main__":
                sandbox = Sandbox(hang)
                sandbox._lock.acquire()
                assert sandbox._start() is None
                {send}
                print(sandbox._worker.process.pid, sandbox._worker.workdir, flush=True)
                time.sleep(60)
            """
        ),
        encoding="utf-8",
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert parent.stdout is not None
        pid_text, workdir = parent.stdout.readline().split()
        worker_pid = int(pid_text)
        assert _running(worker_pid)
        assert os.path.isdir(workdir)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30.0  # its clean-up runs as it exits (slow when loaded)
        while (_running(worker_pid) or os.path.exists(workdir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker_pid)
        assert not os.path.exists(workdir)
    finally:
        parent.kill()
        parent.wait()


def test_result_channel_refuses_code() -> None:
    """Even a compromised worker cannot make the parent run code through a result."""

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError):
        sandbox_module._decode(pickle.dumps(("ok", Exploit())))
