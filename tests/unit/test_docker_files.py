"""The Docker image's and the deployment examples' promises that hold without Docker.

scripts/docker-smoke.sh checks the image itself (it needs a Docker engine); these check
the files it is built from: the build context the .dockerignore lets through, that only
the builder stage has a compiler, that the node runs as a non-root user behind an init,
and that the compose file and systemd unit give the node time to save when stopped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

# What the .dockerignore must keep out, as a checkout that has run `make test` holds it.
JUNK = [
    ".git/HEAD",
    ".venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so",
    ".pytest_cache/v/cache/nodeids",
    ".hypothesis/examples/x",
    ".ruff_cache/0.5/x",
    "data/checkpoints/round-000005/weights.safetensors",
    "docs/results/learning-run/metrics.jsonl",
    "tests/unit/test_pool.py",
    "sapo_node/__pycache__/node.cpython-311.pyc",
    "sapo_node.egg-info/PKG-INFO",
    "build/lib/sapo_node/node.py",
]
COMPILERS = re.compile(r"^(gcc|g\+\+|cpp|clang|cc|make|build-essential|.*-dev)(=.*)?$")


Rules = list[tuple[bool, str, re.Pattern[str]]]


def _ignore_rules() -> Rules:
    """The .dockerignore as (is an exception, pattern, regex) in file order."""
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, re.escape(part)
            )
        rules.append((negate, pattern, re.compile(regex + r"\Z")))
    return rules


def _sent(path: str, rules: Rules) -> bool:
    """Whether Docker sends ``path``: the last rule matching it or a parent decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    sent = True
    for negate, _, regex in rules:
        if any(regex.match(p) for p in prefixes):
            sent = negate
    return sent


def _context(rules: Rules) -> list[str]:
    """The files of this checkout that Docker sends, without walking excluded trees."""
    exceptions = [pattern for negate, pattern, _ in rules if negate]
    sent = []
    for top, dirs, files in os.walk(REPO):
        rel = Path(top).relative_to(REPO).as_posix()
        under = "" if rel == "." else rel + "/"
        dirs[:] = [
            d
            for d in dirs
            if _sent(under + d, rules) or any(e.startswith(f"{under}{d}/") for e in exceptions)
        ]
        sent += [under + f for f in files if _sent(under + f, rules)]
    return sent


def _stages() -> list[list[str]]:
    """The Dockerfile's stages, each a list of its instructions (continuations joined)."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    stages: list[list[str]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages  # stages[0]: the ARGs before the first FROM


def _instructions(stage: list[str], name: str) -> list[str]:
    return [line[len(name) + 1 :].strip() for line in stage if line.upper().startswith(name + " ")]


def _apt_packages(stage: list[str]) -> set[str]:
    packages = set()
    for run in _instructions(stage, "RUN"):
        for command in run.split("&&"):
            words = command.split()
            if words[:2] == ["apt-get", "install"]:
                packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages


def test_the_context_keeps_out_venv_data_docs_caches_and_git() -> None:
    rules = _ignore_rules()
    assert [p for p in JUNK if _sent(p, rules)] == []


def test_the_context_is_what_the_dockerfile_copies_and_small() -> None:
    sent = _context(_ignore_rules())
    size = sum((REPO / p).stat().st_size for p in sent)
    assert size < 2_000_000, f"the build context is {size} bytes: {sorted(sent)[:20]}"
    for stage in _stages()[1:]:
        for copy in _instructions(stage, "COPY"):
            if copy.startswith("--from"):
                continue
            for source in copy.split()[:-1]:
                assert any(p == source or p.startswith(source + "/") for p in sent), source


def test_only_the_builder_stage_has_a_compiler() -> None:
    builder, runtime = _stages()[1:]
    assert {"gcc", "libgmp-dev"} <= _apt_packages(builder)
    assert [p for p in _apt_packages(runtime) if COMPILERS.match(p)] == []
    assert "libgmp10" in _apt_packages(runtime)  # what fastecdsa links against
    # The runtime stage takes the built environment from the builder, nothing else.
    from_builder = [c for c in _instructions(runtime, "COPY") if c.startswith("--from")]
    assert from_builder == ["--from=builder /opt/sapo-node /opt/sapo-node"]
    assert _instructions(runtime, "FROM") == ["${BASE_IMAGE}"]


def test_build_arguments_default_to_slim_python_and_the_cpu_build_of_torch() -> None:
    preamble, builder, _ = _stages()
    assert _instructions(preamble, "ARG") == ["BASE_IMAGE=python:3.11-slim"]
    args = dict(a.split("=", 1) for a in _instructions(builder, "ARG"))
    assert json.loads(args["TORCH_INDEX_URL"]) == "https://download.pytorch.org/whl/cpu"


def test_the_node_runs_as_a_user_behind_an_init_with_data_in_a_volume() -> None:
    runtime = _stages()[-1]
    assert _instructions(runtime, "USER") == ["sapo"]
    assert _instructions(runtime, "VOLUME") == ['["/data"]']
    # Exec form, so that docker stop's SIGTERM reaches tini (PID 1), which passes it on.
    (entrypoint,) = _instructions(runtime, "ENTRYPOINT")
    argv = json.loads(entrypoint)
    assert argv[:3] == ["/usr/bin/tini", "--", "sapo-node"]
    assert argv[3:] == ["start", "--data-dir", "/data"]
    assert "tini" in _apt_packages(runtime)


def test_the_smoke_script_parses() -> None:
    script = REPO / "scripts" / "docker-smoke.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert script.stat().st_mode & 0o111


def test_compose_runs_the_image_on_the_host_network_with_time_to_save() -> None:
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    service = compose["services"]["sapo-node"]
    assert service["network_mode"] == "host"
    assert service["volumes"] == ["sapo-data:/data"]
    assert service["build"]["context"] == ".."
    assert "sapo-data" in compose["volumes"]
    assert _seconds(service["stop_grace_period"]) >= 60
    assert service["logging"]["options"]["max-size"]


@pytest.mark.parametrize("key", ["TimeoutStopSec", "KillSignal", "KillMode", "ExecStart"])
def test_the_systemd_unit_stops_the_node_with_sigterm_and_time_to_save(key: str) -> None:
    unit = {}
    for line in (REPO / "deploy" / "sapo-node.service").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            unit[k] = v
    want = {
        "TimeoutStopSec": lambda v: int(v) >= 60,
        "KillSignal": lambda v: v == "SIGTERM",
        "KillMode": lambda v: v == "mixed",  # SIGTERM to the node; it stops its children
        "ExecStart": lambda v: " start --data-dir " in v,
    }
    assert want[key](unit[key]), unit.get(key)


def _seconds(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([sm])", value).groups()
    return int(number) * (60 if unit == "m" else 1)
