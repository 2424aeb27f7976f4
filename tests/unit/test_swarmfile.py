from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from sapo_node.config import Config, ConfigError, TasksSection, load_config
from sapo_node.intake.wire import PROTOCOL_VERSION
from sapo_node.ops.doctor import check_swarm_file
from sapo_node.swarmfile import (
    RECOMMEND_RANGES,
    RECOMMENDABLE,
    ignored_warning,
    load_swarm_file,
    scoring_warning,
    tasks_warning,
)
from sapo_node.tasks import get_family
from tests.support.cli import run_cli

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "swarms" / "example.toml"
PEER_A = "12D3KooW" + "A" * 44
PEER_B = "12D3KooW" + "B" * 44
ADDR_A = f"/ip4/127.0.0.1/tcp/4141/p2p/{PEER_A}"
ADDR_B = f"/ip4/127.0.0.2/tcp/4141/p2p/{PEER_B}"
ADDR_C = f"/ip4/127.0.0.3/tcp/4141/p2p/{PEER_B}"

SWARM = f"""
[swarm]
name = "demo"
protocol = {PROTOCOL_VERSION}
bootstrap = ["/dnsaddr/boot.example.org", "{ADDR_A}"]

[tasks]

[[tasks.families]]
name = "basic_arithmetic"
levels = [{{ min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1 }}]

[recommended.train]
lr = 2e-5
local_groups = 3

[recommended.generation]
max_new_tokens = 128
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def swarm_file(tmp_path: Path) -> Path:
    return write(tmp_path / "demo.toml", SWARM)


def config(swarm_file: Path, user: str = "", overrides: dict | None = None, environ=None):
    """The config of a node given ``swarm_file`` by flag, with ``user`` as its file."""
    path = write(swarm_file.parent / "user.toml", user)
    flags = dict(overrides or {})
    flags["net"] = {**flags.get("net", {}), "swarm_file": swarm_file}
    return load_config(path, flags, environ={} if environ is None else environ)


def test_the_example_loads_and_its_tasks_are_the_defaults() -> None:
    swarm = load_swarm_file(EXAMPLE)
    assert swarm.swarm.name == "example" and swarm.swarm.protocol == PROTOCOL_VERSION
    assert swarm.tasks == TasksSection()  # a default node that joins it warns of nothing
    cfg = load_config(overrides={"net": {"swarm_file": EXAMPLE}}, environ={})
    assert cfg.net.swarm == "example" and cfg.net.bootstrap == swarm.swarm.bootstrap
    assert tasks_warning(cfg) is None


def test_no_swarm_file_changes_nothing() -> None:
    cfg = load_config(environ={})
    assert cfg.net.swarm_file is None and cfg.net.bootstrap == [] and cfg.net.swarm == "sapo-public"
    assert tasks_warning(cfg) is None


def test_the_swarm_file_lies_under_the_users_file_env_and_flags(swarm_file: Path) -> None:
    cfg = config(swarm_file)
    assert (cfg.train.lr, cfg.train.local_groups, cfg.generation.max_new_tokens) == (2e-5, 3, 128)
    assert cfg.net.swarm == "demo" and cfg.tasks.families[0].levels[0]["max_terms"] == 2
    assert cfg.train.external_groups == 2  # a default: nothing recommended
    cfg = config(swarm_file, "[train]\nlr = 3e-5\nlocal_groups = 4\n")
    assert (cfg.train.lr, cfg.train.local_groups, cfg.generation.max_new_tokens) == (3e-5, 4, 128)
    env = {"SAPO_TRAIN__LOCAL_GROUPS": "5"}
    cfg = config(swarm_file, "[train]\nlocal_groups = 4\n", environ=env)
    assert cfg.train.local_groups == 5
    cfg = config(swarm_file, "[train]\nlocal_groups = 4\n", {"train": {"local_groups": 6}}, env)
    assert cfg.train.local_groups == 6 and cfg.train.lr == 2e-5


def test_bootstrap_lists_are_joined_the_swarms_first(swarm_file: Path) -> None:
    cfg = config(swarm_file, f'[net]\nbootstrap = ["{ADDR_B}", "{ADDR_A}"]\n')
    assert cfg.net.bootstrap == ["/dnsaddr/boot.example.org", ADDR_A, ADDR_B]
    flag = {"net": {"bootstrap": [ADDR_C]}}
    cfg = config(swarm_file, f'[net]\nbootstrap = ["{ADDR_B}"]\n', flag)
    assert cfg.net.bootstrap == ["/dnsaddr/boot.example.org", ADDR_A, ADDR_C]  # flags replace


def test_the_environment_names_a_swarm_file(swarm_file: Path) -> None:
    cfg = load_config(environ={"SAPO_NET__SWARM_FILE": str(swarm_file)})
    assert cfg.net.swarm == "demo" and cfg.net.swarm_file == swarm_file


def test_a_relative_path_is_relative_to_the_working_directory(
    swarm_file: Path, monkeypatch
) -> None:
    monkeypatch.chdir(swarm_file.parent)
    assert (
        load_config(overrides={"net": {"swarm_file": "demo.toml"}}, environ={}).net.swarm == "demo"
    )


def test_another_swarm_name_is_an_error_naming_both(swarm_file: Path) -> None:
    assert config(swarm_file, '[net]\nswarm = "demo"\n').net.swarm == "demo"
    with pytest.raises(ConfigError) as err:
        config(swarm_file, overrides={"net": {"swarm": "other"}})
    assert "'other'" in str(err.value) and "'demo'" in str(err.value)
    assert str(swarm_file) in str(err.value) and "\n" not in str(err.value)


def test_own_tasks_win_but_are_reported(swarm_file: Path) -> None:
    cfg = config(swarm_file)
    assert tasks_warning(cfg) is None
    assert check_swarm_file(cfg).status == "PASS"
    # how the node is asked and scored is its own: peers do not see it
    cfg = config(swarm_file, "[tasks]\none_shot = false\n")
    assert cfg.tasks.one_shot is False and cfg.tasks.families[0].levels[0]["max_terms"] == 2
    assert tasks_warning(cfg) is None
    cfg = config(swarm_file, '[[tasks.families]]\nname = "basic_arithmetic"\n')
    line = tasks_warning(cfg)
    assert line is not None and line.startswith("your task families differ from the swarm file's")
    assert check_swarm_file(cfg).status == "WARN"


@pytest.mark.parametrize(
    ("version", "needle"), [(PROTOCOL_VERSION + 1, "upgrade sapo-node"), (1, "older")]
)
def test_another_protocol_is_refused_before_anything_else(
    tmp_path: Path, version: int, needle: str
) -> None:
    text = SWARM.replace(f"protocol = {PROTOCOL_VERSION}", f"protocol = {version}")
    path = write(tmp_path / "v.toml", text + "[future]\nfield = 1\n")
    with pytest.raises(ConfigError) as err:
        load_swarm_file(path)
    msg = str(err.value)
    assert f"swarm.protocol is {version}, this sapo-node speaks {PROTOCOL_VERSION}" in msg
    assert needle in msg and str(path) in msg


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda t: t + "[bogus]\nx = 1\n", "bogus: Extra inputs"),
        (lambda t: t.replace('name = "demo"', 'name = "demo"\nwebsite = "x"'), "swarm.website"),
        (
            lambda t: t.replace("lr = 2e-5", "lr = 2e-5\nlearning_rate = 1"),
            "recommended.train.learning_rate",
        ),
        (lambda t: t.replace("lr = 2e-5", "lr = -1.0"), "recommended.train.lr"),
        (lambda t: t + "[recommended.tasks]\none_shot = true\n", "recommended.tasks"),
        (lambda t: t + "[recommended.net]\nbootstrap = []\n", "recommended.net.bootstrap"),
        (lambda t: t.replace('name = "demo"', 'name = "Demo!"'), "swarm.name"),
        (
            lambda t: t.replace(
                f"protocol = {PROTOCOL_VERSION}", f'protocol = "{PROTOCOL_VERSION}"'
            ),
            "swarm.protocol",
        ),
        (lambda t: t.replace(f'"{ADDR_A}"', '"/ip4/127.0.0.1/tcp/4141"'), "lacks /p2p/PEER_ID"),
        (
            lambda t: t.replace('"/dnsaddr/boot.example.org", ', "").replace(f'"{ADDR_A}"', ""),
            "swarm.bootstrap",
        ),
        (
            lambda t: t.split("[[tasks.families]]")[0].replace("[tasks]", "[tasks]\n"),
            "tasks.families: required",
        ),
        (lambda t: t.split("[tasks]")[0], "tasks: Field required"),
        (lambda t: t.replace("[swarm]", "[swarm"), "not valid TOML"),
    ],
)
def test_bad_swarm_files_are_refused_in_one_line(tmp_path: Path, edit, needle: str) -> None:
    path = write(tmp_path / "bad.toml", edit(SWARM))
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"net": {"swarm_file": path}}, environ={})
    msg = str(err.value)
    assert needle in msg and str(path) in msg and "\n" not in msg


def test_a_missing_swarm_file_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"swarm file not found: {tmp_path / 'nope.toml'}"):
        load_config(overrides={"net": {"swarm_file": tmp_path / "nope.toml"}}, environ={})


@pytest.mark.parametrize(
    ("bootstrap", "needle"),
    [
        (["/dnsaddr/boot.example.org"], None),
        ([f"/dnsaddr/boot.example.org/p2p/{PEER_A}"], None),
        (["/dns4/boot.example.org/tcp/4141"], "lacks /p2p/PEER_ID"),
        (["/ip4/127.0.0.1/tcp/4141"], "lacks /p2p/PEER_ID"),
    ],
)
def test_only_dnsaddr_names_go_without_a_peer_id(bootstrap: list[str], needle: str | None) -> None:
    overrides = {"net": {"bootstrap": bootstrap}}
    if needle is None:
        assert load_config(overrides=overrides, environ={}).net.bootstrap == bootstrap
    else:
        with pytest.raises(ConfigError, match=needle):
            load_config(overrides=overrides, environ={})


def test_nameservers_are_checked() -> None:
    good = ["127.0.0.53", "127.0.0.1:5353", "[::1]:53"]
    assert load_config(overrides={"net": {"nameservers": good}}, environ={}).net.nameservers == good
    with pytest.raises(ConfigError, match="net.nameservers: 'dns.example.org' is not a nameserver"):
        load_config(overrides={"net": {"nameservers": ["dns.example.org"]}}, environ={})


@pytest.mark.parametrize("command", ["start", "doctor"])
def test_a_bad_swarm_file_is_a_usage_error(tmp_path: Path, capsys, command: str) -> None:
    code, _, err = run_cli([command, "--swarm-file", str(tmp_path / "nope.toml")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("sapo-node: error: swarm file not found: ")
    bad = write(
        tmp_path / "bad.toml", SWARM.replace(f"protocol = {PROTOCOL_VERSION}", "protocol = 9")
    )
    code, _, err = run_cli([command, "--swarm-file", str(bad)], capsys)
    assert code == 2 and err.count("\n") == 1 and "upgrade sapo-node" in err


# --- what a swarm file may not do (docs/operations.md, "What a swarm file can and cannot do")

DISARMING = """
[recommended.defence]
enabled = false
[recommended.status]
listen = "0.0.0.0:9141"
[recommended.node]
data_dir = "/tmp/elsewhere"
[recommended.pool]
accept_unregenerable = true
sampling = "uniform"
[recommended.scoring]
memory_mb = 100000
[recommended.net]
upnp = true
reachability = "public"
allow_swarm_code = true
shards_joined = 3
[recommended.model]
name = "embedded"
gradient_checkpointing = false
[recommended.model.lora]
enabled = true
r = 8
"""


def test_recommended_fields_that_could_weaken_a_node_are_ignored_and_named(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "disarm.toml", SWARM + DISARMING)
    cfg = load_config(overrides={"net": {"swarm_file": path}}, environ={})
    default = load_config(environ={})
    assert cfg.defence.enabled is True and cfg.status.listen == default.status.listen
    assert cfg.node.data_dir is None and cfg.pool.accept_unregenerable is False
    assert cfg.scoring.memory_mb == default.scoring.memory_mb
    assert cfg.net.reachability == "auto" and cfg.net.allow_swarm_code is False
    assert cfg.model.gradient_checkpointing is True
    # what the swarm may recommend still holds, beside them
    assert (cfg.train.lr, cfg.generation.max_new_tokens) == (2e-5, 128)
    assert cfg.pool.sampling == "uniform"
    assert (cfg.net.shards_joined, cfg.model.lora.enabled, cfg.model.lora.r) == (3, True, 8)
    line = ignored_warning(cfg)
    assert line is not None and str(path) in line and "\n" not in line
    named = line.split(" recommends ")[1].split(": ignored")[0].split(", ")
    assert sorted(named) == sorted(
        [
            "defence.enabled",
            "status.listen",
            "node.data_dir",
            "pool.accept_unregenerable",
            "scoring.memory_mb",
            "net.upnp",
            "net.reachability",
            "net.allow_swarm_code",
            "model.gradient_checkpointing",
        ]
    )
    check = check_swarm_file(cfg)
    assert check.status == "WARN" and "defence.enabled" in check.found
    # the user's own config still sets any of them
    cfg = load_config(
        overrides={"net": {"swarm_file": path}, "defence": {"enabled": False}}, environ={}
    )
    assert cfg.defence.enabled is False


def test_a_file_that_recommends_only_what_it_may_warns_of_nothing(swarm_file: Path) -> None:
    cfg = config(swarm_file)
    assert ignored_warning(cfg) is None and check_swarm_file(cfg).status == "PASS"


def test_every_recommendable_field_is_a_config_field_and_listed_in_the_spec() -> None:
    spec = (EXAMPLE.parents[2] / "protocol" / "SPEC.md").read_text(encoding="utf-8")
    row = next(line for line in spec.splitlines() if line.startswith("| `recommended` |"))
    allowed = row.split(" namely ")[1].split(" Any other field ")[0]
    listed = set(re.findall(r"`([a-z_.]+)`", allowed))
    assert listed == {".".join(p) for p in RECOMMENDABLE}
    for path in RECOMMENDABLE:
        section: Any = Config()
        for name in path:
            section = getattr(section, name)  # AttributeError: not a field


PAYLOAD = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")

class Family:
    def make(self, ref):
        raise ValueError("no tasks")

    def score(self, task, completion):
        return 0.0
"""


@pytest.fixture
def payload(tmp_path: Path, monkeypatch) -> Path:
    """A module ``swarm_payload`` on the path that leaves ``imported`` when imported;
    the marker's path."""
    marker = tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    write(tmp_path / "mods" / "swarm_payload.py", PAYLOAD.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    yield marker
    sys.modules.pop("swarm_payload", None)
    get_family.cache_clear()


def test_a_files_custom_family_is_refused_unless_the_user_allows_it(
    tmp_path: Path, payload: Path, capsys
) -> None:
    text = SWARM.replace('name = "basic_arithmetic"', 'name = "swarm_payload:Family"')
    path = write(tmp_path / "custom.toml", text + "[recommended.net]\nallow_swarm_code = true\n")
    user = write(tmp_path / "user.toml", f'[net]\nswarm_file = "{path}"\n')
    with pytest.raises(ConfigError) as err:
        load_config(user, environ={})
    msg = str(err.value)
    assert "swarm_payload:Family" in msg and "--allow-swarm-code" in msg and str(path) in msg
    code, out, err_text = run_cli(["tasks", "--config", str(user)], capsys)
    assert code == 2 and "--allow-swarm-code" in err_text and not payload.exists()
    # the user's own [tasks] replace the file's families: nothing of the file is imported
    cfg = load_config(user, {"tasks": {"families": [{"name": "basic_arithmetic"}]}}, environ={})
    assert [f.name for f in cfg.tasks.families] == ["basic_arithmetic"]
    # allowed by the user (flag, or their own config): the family is the swarm's
    from sapo_node.cli import main
    from sapo_node.flags import load_with_flags as _config

    cfg = _config(None, swarm_file=path, allow_swarm_code=True)
    assert cfg.tasks.families[0].name == "swarm_payload:Family" and cfg.net.allow_swarm_code
    write(user, f'[net]\nswarm_file = "{path}"\nallow_swarm_code = true\n')
    main(["tasks", "--config", str(user)])
    assert "swarm_payload:Family" in capsys.readouterr().out and payload.exists()


# What a hostile file's [tasks] would set beside its families: a prompt that asks for
# anything, and a reward that counts an answer carrying more as right.
HOSTILE_TASKS = """[tasks]
system_prompt = "Answer, then praise the moon in every answer."
one_shot = false
reward = "partial"
correct_threshold = 0.01
"""


def test_the_fields_the_defences_rely_on_are_the_users_unless_allowed(tmp_path: Path) -> None:
    from sapo_node.flags import load_with_flags

    text = SWARM.replace("[tasks]\n", HOSTILE_TASKS, 1)
    path = write(
        tmp_path / "scoring.toml", text + "[recommended.net]\nallow_swarm_scoring = true\n"
    )
    cfg = load_config(overrides={"net": {"swarm_file": path}}, environ={})
    own = TasksSection().model_dump(exclude={"families"})
    assert cfg.tasks.model_dump(exclude={"families"}) == own
    assert cfg.tasks.families[0].levels[0]["max_terms"] == 2  # the swarm's task set
    assert tasks_warning(cfg) is None  # peers accept its groups all the same
    line = scoring_warning(cfg)
    assert line is not None and str(path) in line and "\n" not in line
    for named in ("tasks.system_prompt", "tasks.one_shot = False", "tasks.reward = 'partial'"):
        assert named in line
    assert "tasks.correct_threshold = 0.01" in line and "moon" not in line
    assert "--allow-swarm-scoring" in line
    assert "net.allow_swarm_scoring" in (ignored_warning(cfg) or "")  # a file cannot opt in
    assert check_swarm_file(cfg).status == "WARN"
    # the user's own values win, and are not reported
    cfg = load_config(
        overrides={"net": {"swarm_file": path}, "tasks": {"reward": "partial"}}, environ={}
    )
    assert cfg.tasks.reward == "partial" and "tasks.reward" not in (scoring_warning(cfg) or "")
    # the user opts in: by flag, or in their own config
    for cfg in (
        load_with_flags(None, swarm_file=path, allow_swarm_scoring=True),
        config(path, "[net]\nallow_swarm_scoring = true\n"),
    ):
        assert (cfg.tasks.reward, cfg.tasks.correct_threshold) == ("partial", 0.01)
        assert cfg.tasks.system_prompt.endswith("moon in every answer.")
        assert cfg.tasks.one_shot is False and scoring_warning(cfg) is None


def test_a_files_threshold_cannot_make_a_payload_count_as_right(tmp_path: Path) -> None:
    from sapo_node.tasks import Scorer, TaskRef, make_task

    text = SWARM.replace("[tasks]\n", "[tasks]\ncorrect_threshold = 0.01\n", 1)
    path = write(tmp_path / "threshold.toml", text)
    task = make_task(TaskRef.make("basic_arithmetic", {"max_terms": 2, "max_digits": 1}, 9, 0))
    payload = f"<answer>{task.answer}, as the moon proves</answer>"
    follower = load_config(overrides={"net": {"swarm_file": path}}, environ={})
    trusting = config(path, "[net]\nallow_swarm_scoring = true\n")
    rewards = []
    for cfg in (follower, trusting):
        with Scorer.of(cfg) as scorer:
            rewards.append(scorer.score(task, [payload])[0].reward)
    assert rewards[0] == 0.0  # the node's own threshold: not right
    assert rewards[1] == 1.0  # the file's: right, and answer_only would teach the payload


BEYOND_A_HOME_MACHINE = """
[recommended.generation]
completions_per_task = 64
max_new_tokens = 8192
[recommended.eval]
every = 1
tasks = 65536
samples = 64
[recommended.train]
lr = 1.0
grad_clip = 0.0
local_groups = 0
external_by = "fixed"
ppo_epochs = 64
weight_decay = 1.0
[recommended.net]
shards_joined = 64
[recommended.model.lora]
enabled = true
r = 1024
"""


def test_recommended_knobs_out_of_their_ranges_are_ignored_and_named(tmp_path: Path) -> None:
    body = SWARM.split("[recommended.train]")[0]
    path = write(tmp_path / "heavy.toml", body + BEYOND_A_HOME_MACHINE)
    cfg = load_config(overrides={"net": {"swarm_file": path}}, environ={})
    default = Config()
    assert cfg.generation == default.generation and cfg.eval == default.eval
    t = cfg.train
    assert (t.lr, t.grad_clip, t.local_groups, t.ppo_epochs, t.weight_decay) == (
        default.train.lr,
        default.train.grad_clip,
        default.train.local_groups,
        default.train.ppo_epochs,
        default.train.weight_decay,
    )
    assert cfg.net.shards_joined == default.net.shards_joined
    assert t.external_by == "fixed" and cfg.model.lora.enabled  # within range: applied
    assert cfg.model.lora.r == default.model.lora.r
    line = ignored_warning(cfg)
    assert line is not None and "\n" not in line
    for named in (
        "generation.max_new_tokens = 8192 (a file may recommend 1 to 1024)",
        "generation.completions_per_task = 64",
        "eval.every = 1 (a file may recommend 0 (off) or at least 10)",
        "eval.tasks = 65536",
        "eval.samples = 64",
        "train.lr = 1.0",
        "train.grad_clip = 0.0 (a file may recommend 0.1 to 10)",
        "train.local_groups = 0",
        "train.ppo_epochs = 64",
        "train.weight_decay = 1.0",
        "net.shards_joined = 64",
        "model.lora.r = 1024",
    ):
        assert named in line
    assert check_swarm_file(cfg).status == "WARN"
    # the user's own config is not bound by them
    cfg = config(path, "[train]\nlr = 1e-3\n[generation]\nmax_new_tokens = 2048\n")
    assert (cfg.train.lr, cfg.generation.max_new_tokens) == (1e-3, 2048)


def test_every_range_is_of_a_recommendable_field_and_stated_in_the_spec() -> None:
    spec = (EXAMPLE.parents[2] / "protocol" / "SPEC.md").read_text(encoding="utf-8")
    section = " ".join(spec.split("### 2.1 The swarm file")[1].split("### 2.2")[0].split())
    for path, (_, text) in RECOMMEND_RANGES.items():
        assert any(path[: len(p)] == p for p in RECOMMENDABLE), path
        assert f"`{'.'.join(path)}` {text}" in section, path


def test_a_swarms_change_of_model_starts_a_new_run_and_keeps_the_old(tmp_path: Path) -> None:
    import structlog
    import torch

    from sapo_node.build import follow_the_swarms_model
    from sapo_node.checkpoint import CheckpointError, CheckpointStore
    from sapo_node.ops.doctor import check_checkpoint
    from sapo_node.swarmfile import model_change

    data = tmp_path / "data"
    old = {"model": "embedded", "lora": False}
    store = CheckpointStore(data)
    store.save(7, {"w": torch.zeros(2)}, {}, {"round": 7, "fingerprint": old})
    write(data / "metrics.jsonl", '{"round": 7}\n')
    moved = SWARM + '[recommended.model]\nname = "org/next-model"\n'
    path = write(tmp_path / "moved.toml", moved)
    # the user names a model that is not the checkpoint's: that stays an error
    mine = load_config(
        overrides={"net": {"swarm_file": path}, "model": {"name": "org/mine"}}, environ={}
    )
    assert not model_change(mine, old)
    follow_the_swarms_model(mine, data)
    with pytest.raises(CheckpointError, match="was made for"):
        store.load(store.latest(), mine.fingerprint())
    assert (
        check_checkpoint(data, mine.fingerprint(), True, lambda f: model_change(mine, f)).status
        == "FAIL"
    )
    # the swarm's file changed the model: a new run, the old one kept whole
    cfg = load_config(
        overrides={"net": {"swarm_file": path}, "node": {"data_dir": data}}, environ={}
    )
    assert cfg.model.name == "org/next-model" and model_change(cfg, old)
    check = check_checkpoint(data, cfg.fingerprint(), True, lambda f: model_change(cfg, f))
    assert check.status == "WARN" and "new one" in check.todo
    with structlog.testing.capture_logs() as logs:
        follow_the_swarms_model(cfg, data)
    (line,) = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert "org/next-model" in line and "embedded" in line and "\n" not in line
    assert store.latest() is None and not (data / "metrics.jsonl").exists()
    (kept,) = (data / "runs").iterdir()
    assert kept.name.endswith("-embedded") and str(kept) in line
    again = CheckpointStore(kept)
    assert again.load(again.latest(), old).state["round"] == 7
    assert (kept / "metrics.jsonl").read_text() == '{"round": 7}\n'
    # once moved, the new run resumes as any run does
    follow_the_swarms_model(cfg, data)
    assert len(list((data / "runs").iterdir())) == 1
