"""Every engine knob is defined once (EngineConfig): the CLI flags, the server settings, the
seeded policy version and the bounds read it, so none of them can drift from it."""

from __future__ import annotations

from typing import get_args

import pytest
from annotated_types import Ge, Le

from control.cli import GENERATE_FLAGS, build_parser
from control.core.config import (
    ENGINE_SETTINGS,
    MEMORY_RESERVE_BOUNDS,
    POLICY_OVERRIDES,
    Settings,
    engine_type,
)
from control.policy.rows import DEFAULT_SETTINGS
from control.policy.schemas import PolicySettings
from engine import config as engine_config
from engine.config import EngineConfig, config_default, config_options
from policies.base import PolicyName
from tests.control.support import ADMIN, NUM_KV_BLOCKS, TOKEN, ServerProcess


def _bounds(metadata: list) -> tuple[float | None, float | None]:
    ge = next((m.ge for m in metadata if isinstance(m, Ge)), None)
    le = next((m.le for m in metadata if isinstance(m, Le)), None)
    return ge, le


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*argv, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_generate_flags_default_to_engine_config():
    args = vars(build_parser().parse_args(["generate", "--prompt", "x"]))
    # generate's --seed is the sampling seed (SamplingParams), not EngineConfig.seed
    engine_flags = {name for name in args if name in config_options() and name != "seed"}
    assert engine_flags == set(GENERATE_FLAGS)
    for name in engine_flags:
        assert args[name] == config_default(name), name


def test_generate_flags_parse_with_engine_types():
    args = build_parser().parse_args(
        ["generate", "--prompt", "x", "--memory-reserve", "0.2", "--max-num-seqs", "3"]
    )
    assert args.memory_reserve == 0.2 and args.max_num_seqs == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--prompt", "x", "--block-size", "8"])


def test_serve_flags_are_unset_so_settings_and_the_store_decide():
    for command in ("serve", "up"):
        args = vars(build_parser().parse_args([command]))
        for name in (*POLICY_OVERRIDES, *ENGINE_SETTINGS):
            assert name in args and args[name] is None, (command, name)


def test_settings_engine_fields_match_engine_config():
    """Same type (written out for the type checker), same default (None for a policy
    override), same bounds, same help as EngineConfig."""
    engine_fields = [n for n in Settings.model_fields if n in config_options()]
    assert set(engine_fields) == {*POLICY_OVERRIDES, *ENGINE_SETTINGS}
    for name in engine_fields:
        field, option = Settings.model_fields[name], config_options()[name]
        expected = None if name in POLICY_OVERRIDES else option.default
        assert field.default == expected, name
        assert _bounds(field.metadata) == (option.ge, option.le), name
        assert field.description == option.help, name
        assert field.annotation == engine_type(name), name


def test_settings_validate_with_engine_types_and_bounds():
    assert Settings(block_size=32, max_num_seqs="7").max_num_seqs == 7
    for bad in ({"block_size": 8}, {"memory_reserve": 0.6}, {"max_model_len": 1}):
        with pytest.raises(ValueError):
            Settings(**bad)
    with pytest.raises(ValueError, match="policy"):
        Settings(policy="fifo")


def test_policy_choices_come_from_policy_name(capsys):
    choices = "{" + ",".join(get_args(PolicyName)) + "}"
    assert f"--policy {choices}" in _help(["serve"], capsys)
    assert f"--policy {choices}" in _help(["generate"], capsys)


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_help_documents_each_engine_flag(command, capsys):
    text = _help([command], capsys)
    names = GENERATE_FLAGS if command == "generate" else (*POLICY_OVERRIDES, *ENGINE_SETTINGS)
    for name in names:
        option = config_options()[name]
        assert f"--{name.replace('_', '-')}" in text, name
        assert option.help in text, name
        if command == "generate" and option.default is not None:
            assert f"{option.help} (default {option.default})" in text, name


def test_engine_config_is_built_from_settings_by_name():
    settings = Settings(max_num_seqs=7, block_size=32, max_waiting=3, num_threads=1)
    config = EngineConfig(model="m", **settings.engine_values())
    assert (config.max_num_seqs, config.block_size, config.max_waiting) == (7, 32, 3)
    assert config.num_threads == 1


def test_seeded_version_and_reserve_bounds_read_engine_config():
    assert DEFAULT_SETTINGS.policy.name == config_default("policy")
    assert DEFAULT_SETTINGS.memory_reserve == config_default("memory_reserve")
    assert MEMORY_RESERVE_BOUNDS is engine_config.MEMORY_RESERVE_BOUNDS
    reserve = config_options()["memory_reserve"]
    assert (reserve.ge, reserve.le) == MEMORY_RESERVE_BOUNDS
    field = PolicySettings.model_fields["memory_reserve"]
    assert _bounds(field.metadata) == MEMORY_RESERVE_BOUNDS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory_reserve": 0.51}, r"memory_reserve must be in \[0.0, 0.5\], got 0.51"),
        ({"max_model_len": 1}, "max_model_len must be >= 2, got 1"),
        ({"num_kv_blocks": 0}, "num_kv_blocks must be >= 1, got 0"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be >= 1, got 0"),
        ({"num_threads": 0}, "num_threads must be >= 1, got 0"),
    ],
)
def test_engine_config_checks_the_bounds_of_its_metadata(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **kwargs)


def test_serve_flags_and_variables_reach_the_engine(tiny_model_dir, tmp_path):
    """A real server: engine flags and ``SERVEDECK_*`` variables reach EngineConfig by name,
    the policy overrides reach the policy in force."""
    flags = [
        "--admin-token", TOKEN, "--block-size", "32", "--max-num-seqs", "3",
        "--policy", "hybrid", "--memory-reserve", "0.2",
    ]  # fmt: skip
    server = ServerProcess(
        tiny_model_dir,
        tmp_path,
        flags,
        {"SERVEDECK_MAX_NUM_BATCHED_TOKENS": "100"},
    )
    server.start()
    try:
        with server.client(headers=ADMIN) as http:
            limits = http.get("/admin/policy/schema").json()["engine_limits"]
            policy = http.get("/admin/policy").json()["settings"]
    finally:
        server.stop()
    assert limits["block_size"] == 32 and limits["max_num_seqs"] == 3
    assert limits["max_num_batched_tokens"] == 100
    assert limits["num_kv_blocks"] == NUM_KV_BLOCKS
    assert (policy["policy"]["name"], policy["memory_reserve"]) == ("hybrid", 0.2)
