"""``sapo-node doctor``: a preflight of this machine against a node's config.

Each check is a small function of what it looks at (versions, a GPU list, byte counts, a
path, addresses) that returns one ``Check``: PASS, WARN or FAIL, what was found, and what
to do. ``run_checks`` gathers those inputs from the machine and the config; tests call the
checks directly with inputs that fail on purpose. ``sapo-node doctor`` prints one line
per check and exits 0 when nothing FAILs (warnings allowed), 1 otherwise. The memory
and disk a node needs are estimated in ``resources``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo_node.config import Config
from sapo_node.net.ports import bind_error
from sapo_node.ops.resources import (
    GiB,
    MemoryNeed,
    MiB,
    ModelInfo,
    ModelInfoError,
    disk_need,
    memory_need,
    model_info,
    safetensors_params,
)
from sapo_node.swarmfile import model_change

PYTHON_MIN = (3, 11)  # pyproject's requires-python
PYTHON_TESTED_MAX = (3, 13)
TORCH_MIN = (2, 4)  # pyproject's torch>=2.4
TORCH_TESTED = "2.13"

TIGHT = 0.9  # a need above this share of what is free: WARN


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    status: str  # "PASS", "WARN" or "FAIL"
    name: str
    found: str
    todo: str = ""

    def line(self) -> str:
        text = f"{self.status}  {self.name:<13} {self.found}"
        return f"{text} -> {self.todo}" if self.todo else text


def _pass(name: str, found: str) -> Check:
    return Check("PASS", name, found)


def _warn(name: str, found: str, todo: str) -> Check:
    return Check("WARN", name, found, todo)


def _fail(name: str, found: str, todo: str) -> Check:
    return Check("FAIL", name, found, todo)


def _size(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in re.split(r"[.+]", text)[:3]:
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


# --- versions ------------------------------------------------------------------------


def check_python(version: Sequence[int]) -> Check:
    """Python against requires-python (3.11+) and the versions tested (up to 3.13)."""
    v = tuple(version[:3])
    text = ".".join(map(str, v))
    tested = f"{PYTHON_MIN[0]}.{PYTHON_MIN[1]} to {PYTHON_TESTED_MAX[0]}.{PYTHON_TESTED_MAX[1]}"
    if v[:2] < PYTHON_MIN:
        return _fail(
            "python",
            f"Python {text}; sapo-node needs 3.11 or newer",
            "install Python 3.11+ and recreate the environment "
            "(make clean-venv && make test PYTHON=python3.11)",
        )
    if v[:2] > PYTHON_TESTED_MAX:
        return _warn(
            "python",
            f"Python {text} is newer than the versions tested ({tested})",
            "if a dependency will not install or import, use Python 3.11 to 3.13",
        )
    return _pass("python", f"Python {text} (supported: {tested})")


def check_torch(version: str | None) -> Check:
    """torch installed, at least 2.4 (pyproject), tested with 2.13."""
    if version is None:
        return _fail(
            "torch",
            "torch is not installed",
            "run sh scripts/install.sh (make test does), or pip install 'torch>=2.4'",
        )
    if _version_tuple(version)[:2] < TORCH_MIN:
        return _fail(
            "torch",
            f"torch {version}; sapo-node needs 2.4 or newer",
            "pip install -U 'torch>=2.4' (a CPU build: TORCH_INDEX_URL="
            "https://download.pytorch.org/whl/cpu sh scripts/install.sh)",
        )
    return _pass("torch", f"torch {version} (supported: 2.4 or newer, tested {TORCH_TESTED})")


def check_packages(requirements: Iterable[str], installed: Callable[[str], str | None]) -> Check:
    """Every requirement of the sapo-node package (``requirements``, PEP 508 strings)
    met by ``installed(name)`` (its version, or None when missing)."""
    from packaging.requirements import InvalidRequirement, Requirement

    bad = []
    count = 0
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra (dev) or another platform
        count += 1
        have = installed(req.name)
        if have is None:
            bad.append(f"{req.name} missing (needs {req.specifier or 'any'})")
        elif req.specifier and not req.specifier.contains(have, prereleases=True):
            bad.append(f"{req.name} {have} (needs {req.specifier})")
    if bad:
        return _fail(
            "packages",
            "; ".join(bad),
            "install the project's requirements: pip install -e . (or make test)",
        )
    return _pass("packages", f"the {count} requirements of sapo-node are met")


def _installed_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _own_requirements() -> list[str]:
    import importlib.metadata

    try:
        return list(importlib.metadata.requires("sapo-node") or [])
    except importlib.metadata.PackageNotFoundError:
        return []


# --- torch's build against the machine ---------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """An NVIDIA GPU as nvidia-smi reports it."""

    name: str
    capability: tuple[int, int] | None = None
    memory_free: int | None = None  # bytes
    memory_total: int | None = None


@dataclass(frozen=True)
class TorchBuild:
    """What the installed torch was built for and what it sees."""

    version: str
    cuda: str | None  # torch.version.cuda: None for a CPU-only build
    arch_list: tuple[str, ...] = ()  # e.g. ("sm_80", "sm_90", "compute_90")
    cuda_available: bool = False
    mps_available: bool = False


def detect_gpus(smi: str | None = None) -> tuple[bool, list[Gpu]]:
    """(an NVIDIA GPU is present, the GPUs nvidia-smi lists). Present means nvidia-smi
    on the PATH or /dev/nvidia0; the list may be empty when nvidia-smi cannot answer."""
    smi = smi if smi is not None else shutil.which("nvidia-smi")
    present = smi is not None or Path("/dev/nvidia0").exists()
    if smi is None:
        return present, []
    gpus = []
    for fields in (
        "name,compute_cap,memory.free,memory.total",
        "name,memory.free,memory.total",  # drivers before 510 have no compute_cap
    ):
        try:
            out = subprocess.run(
                [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.SubprocessError):
            return present, []
        if out.returncode == 0:
            break
    else:
        return present, []
    for row in out.stdout.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        cap = None
        if len(cells) == 4:
            m = re.fullmatch(r"(\d+)\.(\d+)", cells.pop(1))
            cap = (int(m.group(1)), int(m.group(2))) if m else None
        mem = [int(float(c)) * MiB if re.fullmatch(r"[\d.]+", c) else None for c in cells[1:3]]
        gpus.append(Gpu(cells[0], cap, *mem))
    return present, gpus


def torch_build() -> TorchBuild:
    """The installed torch's build (torch must import)."""
    import torch

    arch: tuple[str, ...] = ()
    if torch.version.cuda is not None:
        flags = getattr(torch._C, "_cuda_getArchFlags", None)
        text = flags() if flags is not None else None
        arch = tuple(text.split()) if text else tuple(torch.cuda.get_arch_list())
    mps = getattr(torch.backends, "mps", None)
    return TorchBuild(
        version=torch.__version__,
        cuda=torch.version.cuda,
        arch_list=arch,
        cuda_available=torch.cuda.is_available(),
        mps_available=mps is not None and mps.is_available(),
    )


def arch_supports(arch_list: Iterable[str], capability: tuple[int, int]) -> bool:
    """Whether kernels compiled for ``arch_list`` run on a GPU of ``capability``: a
    ``sm_XY`` binary runs on X.Y and later minor versions of the same major (``sm_90a``
    only on 9.0), ``compute_XY`` PTX is compiled at load time for any later GPU."""
    major, minor = capability
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+?)(\d)([af]?)", arch.strip())
        if not m:
            continue
        kind, a_major, a_minor, suffix = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if kind == "compute" and (a_major, a_minor) <= (major, minor) and not suffix:
            return True
        if kind == "sm" and a_major == major and (a_minor == minor if suffix else a_minor <= minor):
            return True
    return False


def check_torch_build(
    nvidia_present: bool, gpus: Sequence[Gpu], build: TorchBuild, device: str
) -> Check:
    """torch's build against the machine: a CPU-only torch on a machine with an NVIDIA
    GPU, a CUDA torch that cannot use the GPU or has no kernels for its capability."""
    name = "torch build"
    where = f"torch {build.version}"
    gpu_names = ", ".join(f"{g.name}{_cap(g.capability)}" for g in gpus) or "an NVIDIA GPU"
    if not nvidia_present:
        if device == "cuda":
            return _fail(
                name,
                "device cuda is configured but this machine has no NVIDIA GPU "
                "(no nvidia-smi, no /dev/nvidia0)",
                "use --device auto or cpu",
            )
        if build.mps_available:
            return _pass(name, f"{where}, Apple GPU (MPS) available")
        if device == "mps":
            return _fail(
                name,
                f"device mps is configured but {where} sees no Apple GPU (MPS)",
                "use --device auto or cpu, or a torch build with MPS (macOS on Apple silicon)",
            )
        kind = "CPU-only build" if build.cuda is None else f"CUDA {build.cuda} build"
        return _pass(name, f"{where} ({kind}); no NVIDIA GPU here, the node runs on the CPU")
    if device == "cpu":
        return _pass(name, f"{where}; {gpu_names} present, device cpu is configured")
    if build.cuda is None:
        return _fail(
            name,
            f"{where} is a CPU-only build on a machine with {gpu_names}",
            "install a CUDA build of torch: pip install --force-reinstall torch "
            "(or TORCH_SPEC=torch sh scripts/install.sh); --device cpu to run on the CPU",
        )
    caps = [g.capability for g in gpus if g.capability is not None]
    if build.arch_list:
        missing = [c for c in caps if not arch_supports(build.arch_list, c)]
        if missing:
            cap = f"{missing[0][0]}.{missing[0][1]}"
            return _fail(
                name,
                f"{where} (CUDA {build.cuda}) has kernels for {' '.join(build.arch_list)}, "
                f"not for {gpu_names} (compute capability {cap})",
                "install a torch build whose CUDA supports this GPU (PyTorch's install "
                "selector lists them), e.g. pip install --force-reinstall torch "
                "--index-url https://download.pytorch.org/whl/cu128",
            )
    if not build.cuda_available:
        return _fail(
            name,
            f"{where} (CUDA {build.cuda}) cannot use {gpu_names}: torch.cuda.is_available() "
            "is false",
            "check the NVIDIA driver (nvidia-smi must work, and be new enough for CUDA "
            f"{build.cuda}) and CUDA_VISIBLE_DEVICES",
        )
    return _pass(name, f"{where} (CUDA {build.cuda}) runs on {gpu_names}")


def _cap(capability: tuple[int, int] | None) -> str:
    return f" (sm_{capability[0]}{capability[1]})" if capability else ""


# --- the model -----------------------------------------------------------------------


def check_model(name: str, info: ModelInfo | ModelInfoError) -> Check:
    """The model can be found, and how big it is."""
    if isinstance(info, ModelInfoError):
        text = str(info)
        if "local Hugging Face cache" in text:
            return _warn("model", text, "download it once where the hub is reachable")
        return _fail(
            "model",
            text,
            "give --model embedded, a local model directory or a Hugging Face id",
        )
    if not info.weights_present:
        return _fail(
            "model",
            f"{info.where} has a config.json but no weights (*.safetensors, *.bin)",
            "give a complete model directory",
        )
    note = "" if info.cached else "; de-quantised once at first start (about 30 s)"
    return _pass("model", f"{info.where}: {info.params / 1e6:.1f} M parameters{note}")


# --- memory ----------------------------------------------------------------------------


def check_memory(
    need: int, available: int, where: str = "in RAM", detail: str = "", name: str = "memory"
) -> Check:
    """Whether ``need`` bytes fit in the ``available`` ones."""
    found = f"needs about {_size(need)}{detail}, {_size(available)} free {where}"
    todo = (
        "lower train.micro_batch_size, generation.max_batch_sequences or "
        "generation.max_new_tokens, train LoRA adapters (--lora), or free memory"
    )
    if need > available:
        return _fail(name, found, todo)
    if need > TIGHT * available:
        return _warn(name, found + " (little headroom)", todo)
    return _pass(name, found)


def _describe_parts(need: MemoryNeed) -> str:
    return " (" + ", ".join(f"{k} {_size(v)}" for k, v in need.parts.items()) + ")"


def available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def gpu_free_memory(gpus: Sequence[Gpu], build: TorchBuild | None) -> int | None:
    """Free bytes on the first GPU: torch's view if it can use it, else nvidia-smi's."""
    if build is not None and build.cuda_available:
        import torch

        free, _total = torch.cuda.mem_get_info(0)
        return int(free)
    return gpus[0].memory_free if gpus else None


# --- disk ----------------------------------------------------------------------------


def free_disk(path: Path) -> int:
    """Free bytes on the file system of ``path``, or of its nearest existing parent."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return int(shutil.disk_usage(probe).free)


def check_disk(need: int, free: int, data_dir: Path) -> Check:
    """Free disk in the data directory for checkpoints, cache and pool."""
    probe = data_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        return _fail(
            "disk",
            f"{probe} is not writable",
            "pass a --data-dir this user can write, or fix its permissions",
        )
    found = (
        f"needs about {_size(need)} for checkpoints, cache and pool, {_size(free)} free in {probe}"
    )
    todo = (
        "free disk space, pass a --data-dir on a larger disk, lower node.keep_checkpoints, "
        "or train LoRA adapters (--lora: small checkpoints)"
    )
    if need > free:
        return _fail("disk", found, todo)
    if need > TIGHT * free:
        return _warn("disk", found + " (little headroom)", todo)
    return _pass("disk", found)


# --- port, identity, lock, checkpoint --------------------------------------------------


def check_port(listen: Sequence[str], enabled: bool = True) -> Check:
    """Each TCP port the node would listen on is free to bind (as ``start`` checks it)."""
    if not enabled:
        return _pass("port", "offline: no port to listen on")
    ports = []
    for text in listen:
        m = re.fullmatch(r"/ip([46])/([^/]+)/tcp/(\d+)(/.*)?", text)
        if not m:
            return _fail("port", f"cannot read listen address {text!r}", "give /ip4/HOST/tcp/PORT")
        host, port = m.group(2), int(m.group(3))
        if port == 0:
            ports.append(f"{host}:any")
            continue
        exc = bind_error(host, port)
        if exc is not None and exc.errno == errno.EADDRINUSE:
            return _fail(
                "port",
                f"TCP port {port} on {host} is in use (another sapo-node?)",
                f"stop the other program, or pass --listen /ip4/{host}/tcp/OTHER_PORT",
            )
        if exc is not None:
            return _fail(
                "port",
                f"cannot listen on {text}: {exc.strerror or exc}",
                "pass a --listen address of this machine",
            )
        ports.append(f"{host}:{port}")
    return _pass("port", "free to listen on " + ", ".join(ports))


def check_status_port(listen: str, enabled: bool = True) -> Check:
    """The status endpoint's HOST:PORT is free to bind."""
    from sapo_node.config import DEFAULT_STATUS_LISTEN, parse_host_port

    name = "status port"
    if not enabled:
        return _pass(name, "status endpoint off")
    try:
        host, port = parse_host_port(listen)
    except ValueError as exc:
        return _fail(name, str(exc), "give --status-listen HOST:PORT")
    if port == 0:
        return _pass(name, f"{host}: any free port")
    exc = bind_error(host, port)
    if exc is None:
        return _pass(name, f"free to serve on {listen}")
    busy = exc.errno == errno.EADDRINUSE
    if busy and listen == DEFAULT_STATUS_LISTEN:
        return _pass(name, f"{listen} taken (another sapo-node?): the node takes a free port")
    return _fail(
        name,
        f"TCP port {port} on {host} is in use (another sapo-node?)"
        if busy
        else f"cannot listen on {listen}: {exc.strerror or exc}",
        "pass --status-listen HOST:OTHER_PORT (port 0 picks a free one), or set "
        "status.enabled = false",
    )


def check_identity_key(path: Path) -> Check:
    """The identity key: private to its owner (no group or world bits) and a key."""
    if not path.exists():
        return _pass("identity key", f"none yet: {path} is created (mode 0600) at first start")
    try:
        mode = path.stat().st_mode & 0o777
    except OSError as exc:
        return _fail("identity key", f"cannot stat {path}: {exc}", "fix its permissions")
    if mode & 0o077:
        return _fail(
            "identity key",
            f"{path} is mode {mode:03o}: readable or writable by others",
            f"chmod 600 {path}",
        )
    try:
        from sapo_node.net import NetError
        from sapo_node.net.identity import load, peer_id

        key = load(path)
    except NetError as exc:
        return _fail(
            "identity key",
            str(exc),
            "restore the key, or move it away to start with a new peer ID",
        )
    except ImportError as exc:  # libp2p missing: the packages check says so
        return _warn("identity key", f"{path} is mode {mode:03o}; cannot parse it: {exc}", "")
    return _pass("identity key", f"{path} (mode {mode:03o}), peer ID {peer_id(key)}")


def check_swarm_file(cfg: Config) -> Check:
    """The node's tasks against its swarm file's (with others it runs, but it and the
    swarm refuse each other's groups), and the fields it recommends that it may not."""
    from sapo_node.swarmfile import ignored_warning, scoring_warning, tasks_warning

    differ = tasks_warning(cfg)
    if differ:
        return _warn("swarm file", differ, "drop your own [tasks] to follow the swarm's")
    ignored = ignored_warning(cfg)
    if ignored:
        return _warn("swarm file", ignored, "ask its organiser to drop those fields")
    scoring = scoring_warning(cfg)
    if scoring:
        return _warn("swarm file", scoring, "nothing, unless you trust the file's source")
    n = len(cfg.net.bootstrap)
    return _pass(
        "swarm file", f"{cfg.net.swarm_file}: swarm {cfg.net.swarm}, its tasks, {n} bootstrap"
    )


def check_lock(data_dir: Path) -> Check:
    """No other process holds the data directory's lock (a node running there)."""
    path = data_dir / "lock"
    if not path.exists():
        return _pass("data dir", f"{data_dir}: not in use")
    try:
        with path.open("rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = handle.read(32).decode("ascii", "replace").strip()
                who = f" (pid {pid})" if pid.isdigit() else ""
                return _fail(
                    "data dir",
                    f"{data_dir} is in use by another sapo-node{who}",
                    "stop that node, or pass another --data-dir",
                )
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError as exc:
        return _fail("data dir", f"cannot open {path}: {exc}", "fix its permissions")
    return _pass("data dir", f"{data_dir}: not in use")


def check_checkpoint(
    data_dir: Path,
    fingerprint: dict[str, Any],
    trains: bool = True,
    new_run: Callable[[Any], bool] | None = None,
) -> Check:
    """The checkpoint a start would resume from belongs to this config (model, LoRA; a
    generating member's data dir holds no trained weights), or ``new_run`` says a start
    sets it aside for a new run (the swarm file changed the model); its hashes are checked
    at start, not here."""
    from sapo_node.checkpoint import STATE, WEIGHTS, CheckpointError, CheckpointStore

    try:
        path = CheckpointStore(data_dir).latest()
    except CheckpointError as exc:
        return _fail("checkpoint", str(exc), "fix LATEST, or pass another --data-dir")
    if path is None:
        return _pass("checkpoint", "none: the node starts from round 0")
    try:
        state = json.loads((path / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return _fail(
            "checkpoint",
            f"{path} cannot be read: {exc}",
            "remove it and point checkpoints/LATEST at an older one",
        )
    theirs = state.get("fingerprint")
    if theirs != fingerprint and new_run is not None and new_run(theirs):
        return _warn(
            "checkpoint",
            f"{path} was made for {theirs}, the swarm file's model is {fingerprint}",
            "nothing: start sets this run aside in runs/ and begins a new one",
        )
    if theirs != fingerprint:
        return _fail(
            "checkpoint",
            f"{path} was made for {theirs}, this config runs {fingerprint}",
            "use the same --model and LoRA setting, or another --data-dir",
        )
    if not trains:
        try:
            trained = safetensors_params([path / WEIGHTS])
        except (OSError, ValueError, KeyError, struct.error):
            trained = 0
        if trained:
            return _fail(
                "checkpoint",
                f"{path} is a training node's checkpoint; a generating member keeps its "
                "model as it is",
                "give the generating member another --data-dir",
            )
    return _pass("checkpoint", f"resumes from round {state.get('round')} ({path.name})")


# --- all of them -----------------------------------------------------------------------


def _resolve_device(preference: str, build: TorchBuild | None) -> str:
    if preference != "auto":
        return preference
    if build is not None and build.cuda_available:
        return "cuda"
    if build is not None and build.mps_available:
        return "mps"
    return "cpu"


def run_checks(cfg: Config, *, no_train: bool = False) -> list[Check]:
    """Every check of this machine against ``cfg`` (``no_train``: a relay, no model; a
    generating member is ``cfg`` with ``train.enabled`` false)."""
    data_dir = cfg.node.resolved_data_dir()
    checks = [check_python(sys.version_info)]
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    checks.append(check_torch(torch_version))
    requirements = _own_requirements()
    if requirements:
        checks.append(check_packages(requirements, _installed_version))
    else:
        checks.append(
            _warn(
                "packages",
                "sapo-node is not installed as a package: its requirements are not checked",
                "pip install -e . (make test does)",
            )
        )
    if not no_train:
        build = torch_build() if torch_version is not None else None
        present, gpus = detect_gpus()
        if build is not None:
            checks.append(check_torch_build(present, gpus, build, cfg.node.device))
        name = cfg.model.name
        try:
            info: ModelInfo | ModelInfoError = model_info(name, data_dir / "models")
        except ModelInfoError as exc:
            info = exc
        checks.append(check_model(name, info))
        if isinstance(info, ModelInfo):
            device = _resolve_device(cfg.node.device, build)
            from sapo_node.train.policy import cpu_has_bf16

            need = memory_need(info, cfg, device, cpu_bf16=device == "cpu" and cpu_has_bf16())
            if device == "cuda":
                checks.append(check_memory(need.host, available_memory(), "in RAM"))
                free = gpu_free_memory(gpus, build)
                if free is None:
                    checks.append(
                        _warn("gpu memory", f"needs about {_size(need.total)}; free unknown", "")
                    )
                else:
                    checks.append(
                        check_memory(
                            need.total, free, "on GPU 0", _describe_parts(need), "gpu memory"
                        )
                    )
            else:
                checks.append(
                    check_memory(need.total, available_memory(), "in RAM", _describe_parts(need))
                )
            disk = disk_need(info, cfg, data_dir, name)
            checks.append(check_disk(disk, free_disk(data_dir), data_dir))
        checks.append(
            check_checkpoint(
                data_dir,
                cfg.fingerprint(),
                cfg.train.enabled,
                lambda made_for: model_change(cfg, made_for),
            )
        )
    checks.append(check_port(cfg.net.listen, cfg.net.enabled))
    if cfg.net.enabled and cfg.net.swarm_file is not None:
        checks.append(check_swarm_file(cfg))
    checks.append(check_status_port(cfg.status.listen, cfg.status.enabled))
    checks.append(check_identity_key(data_dir / "identity.key"))
    checks.append(check_lock(data_dir))
    return checks


def exit_code(checks: Iterable[Check]) -> int:
    """0 when nothing failed (warnings allowed), else 1."""
    return 1 if any(c.status == "FAIL" for c in checks) else 0
