from __future__ import annotations

import re
from pathlib import Path

import pytest

from sapo_node.config import Config, ConfigError, TrainSection, env_overrides, load_config
from sapo_node.tasks import PAPER_FAMILIES

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


def test_there_are_configs() -> None:
    names = {p.name for p in CONFIGS}
    assert {"default.toml", "qwen2.5-0.5b.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_file_loads(path: Path) -> None:
    cfg = load_config(path, environ={})
    assert isinstance(cfg, Config)


def test_default_file_equals_builtin_defaults() -> None:
    by_file = load_config(Path(CONFIGS[0].parent / "default.toml"), environ={})
    assert by_file == load_config(environ={})


def test_paper_config_has_the_nine_families() -> None:
    cfg = load_config(CONFIGS[0].parent / "qwen2.5-0.5b.toml", environ={})
    assert {f.name for f in cfg.tasks.families} == set(PAPER_FAMILIES)
    assert (cfg.train.local_groups, cfg.train.external_groups) == (4, 4)
    assert (cfg.train.eps_low, cfg.train.eps_high, cfg.train.kl_coef) == (0.2, 0.28, 0.0)


def test_precedence_file_env_cli(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[train]\nlr = 1e-4\nlocal_groups = 3\n[node]\nrounds = 7\n")
    env = {"SAPO_TRAIN__LR": "2e-4", "SAPO_NODE__DATA_DIR": '"/x"', "OTHER": "1"}
    cfg = load_config(f, {"train": {"lr": 3e-4}}, environ=env)
    assert cfg.train.lr == 3e-4  # CLI beats environment beats file
    assert cfg.train.local_groups == 3
    assert cfg.node.rounds == 7
    assert cfg.node.data_dir == Path("/x")


def test_env_bare_string() -> None:
    assert env_overrides({"SAPO_MODEL__NAME": "Qwen/Qwen2.5-0.5B"}) == {
        "model": {"name": "Qwen/Qwen2.5-0.5B"}
    }


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"train": {"lr": 0}}, "train.lr"),
        ({"train": {"local_groups": 0, "external_groups": 0}}, "at least 1"),
        ({"train": {"eps_low": 1.5}}, "train.eps_low"),
        ({"train": {"betas": [0.9, 1.0]}}, "betas"),
        ({"generation": {"completions_per_task": 1}}, "completions_per_task"),
        ({"curriculum": {"raise_above": 0.1, "lower_below": 0.2}}, "both ways"),
        ({"tasks": {"families": []}}, "tasks.families"),
        ({"tasks": {"families": [{"name": "a"}, {"name": "a"}]}}, "unique"),
        ({"tasks": {"families": [{"name": "a", "weight": 0}]}}, "weight above 0"),
        ({"tasks": {"families": [{"name": "a", "levels": [{}], "start_level": 3}]}}, "levels"),
        ({"node": {"device": "tpu"}}, "node.device"),
        ({"node": {"device": "cpu"}, "model": {"dtype": "float16"}}, "CPU"),
        ({"train": {"typo_field": 1}}, "typo_field"),
        ({"net": {"lan_ranges": ["198.19.0.0/33"]}}, "net.lan_ranges: '198.19.0.0/33'"),
        ({"net": {"lan_ranges": ["198.19.0.1/16"]}}, "host bits set"),
        # room for the peers it dials, as many dialling in and those it relays for
        ({"net": {"max_connections": 100}}, "net.max_connections (100) is less than"),
        ({"net": {"max_connections": 63, "relay_reservations": 0}}, "(64)"),
    ],
)
def test_bad_values_are_refused_with_a_reason(override: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=override, environ={})
    msg = str(err.value)
    assert needle in msg
    assert "\n" not in msg


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, environ={})


def test_every_field_is_documented() -> None:
    def walk(model: type) -> None:
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann)
            else:
                assert field.description, f"{model.__name__}.{name} has no description"

    walk(Config)


def test_small_micro_batches_skip_checkpointing_only_in_full_fine_tuning_by_default() -> None:
    assert TrainSection().unchecked_tokens(lora=False) == 768
    assert TrainSection().unchecked_tokens(lora=True) == 0  # LoRA's point is memory
    for lora in (False, True):
        assert TrainSection(checkpoint_above_tokens=100).unchecked_tokens(lora) == 100
    with pytest.raises(ValueError):
        TrainSection(checkpoint_above_tokens=-1)


@pytest.mark.parametrize(
    ("addr", "error"),
    [
        ("/ip4/127.0.0.1/tcp/4141/p2p/12D3KooWabc", None),
        ("/dns4/boot.example.org/tcp/4141/p2p/12D3KooWabc", None),
        ("/dnsaddr/bootstrap.example.org", None),
        ("/ip4/127.0.0.1/tcp/4141", "lacks /p2p/PEER_ID (sapo-node identity prints"),
        ("/ip4/127.0.0.1/udp/4141/quic-v1/p2p/12D3KooWabc", "is not TCP"),
        ("/ip4/300.0.0.1/tcp/4141/p2p/12D3KooWabc", "is no ip4 address"),
        ("/ip4/127.0.0.1/tcp/70000/p2p/12D3KooWabc", "is not 1 to 65535"),
    ],
)
def test_net_bootstrap_has_the_swarm_files_grammar(addr: str, error: str | None) -> None:
    """One grammar for a bootstrap address, wherever it is given (net/dnsaddr.parse)."""
    if error is None:
        assert load_config(overrides={"net": {"bootstrap": [addr]}}, environ={}).net.bootstrap
    else:
        with pytest.raises(ConfigError, match=re.escape(error)):
            load_config(overrides={"net": {"bootstrap": [addr]}}, environ={})
