"""The config machinery on sections of its own: flags, help, TOML round trip and type checks."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from agentrl import configlib
from agentrl.errors import ConfigError


@dataclass(frozen=True)
class Box:
    """A toy section."""

    size: int = 3
    """edge length"""
    shape: Literal["cube", "ball"] = "cube"
    """what it is"""
    label: str | None = None
    """optional name; unset = none"""
    extra: dict[str, Any] = field(default_factory=dict)
    """anything else"""
    tags: list[str] = field(default_factory=list, metadata={"flag": "--tag", "metavar": "TAG"})
    """labels"""


SECTIONS = (("box", Box),)


def test_flags_help_and_layering():
    p = argparse.ArgumentParser()
    configlib.add_cli_flags(p, SECTIONS)
    text = p.format_help()
    assert "--size" in text and "edge length (default: 3)" in text and "{cube,ball}" in text
    given = configlib.flag_values(p.parse_args(["--size", "5", "--extra", '{"k": 1}']), SECTIONS)
    assert given == {"box": {"size": 5, "extra": '{"k": 1}'}}  # only what was typed
    (box,) = configlib.build_sections(SECTIONS, given).values()
    assert box == Box(size=5, extra={"k": 1})


def test_toml_round_trip_keeps_an_unset_optional_unset(tmp_path):
    for box in (Box(), Box(label="b", extra={"a": [1, 2]})):
        path = tmp_path / "box.toml"
        path.write_text(configlib.to_toml({"box": box.__dict__}))
        values = configlib.load_toml(path, SECTIONS)
        assert configlib.build_sections(SECTIONS, values)["box"] == box


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"box": {"size": "3"}}, r"box\.size: expected int"),
        ({"box": {"shape": "cone"}}, r"box\.shape='cone': choose one of 'cube', 'ball'"),
        ({"box": {"sise": 3}}, r"unknown key 'sise' in \[box\]; did you mean 'size'"),
    ],
)
def test_bad_values_name_section_and_key(values, match):
    with pytest.raises(ConfigError, match=match):
        configlib.build_sections(SECTIONS, values)


def test_a_list_field_is_a_repeatable_flag_under_its_own_name(tmp_path):
    p = argparse.ArgumentParser()
    configlib.add_cli_flags(p, SECTIONS)
    assert "--tag TAG" in p.format_help() and "labels (default: []); repeatable" in p.format_help()
    given = configlib.flag_values(p.parse_args(["--tag", "a", "--tag", "b"]), SECTIONS)
    (box,) = configlib.build_sections(SECTIONS, given).values()
    assert box.tags == ["a", "b"]
    path = tmp_path / "box.toml"
    path.write_text(configlib.to_toml({"box": box.__dict__}))
    assert configlib.build_sections(SECTIONS, configlib.load_toml(path, SECTIONS))["box"] == box
    with pytest.raises(ConfigError, match=r"box\.tags: expected a list of strings, got \[1\]"):
        configlib.build_sections(SECTIONS, {"box": {"tags": [1]}})
