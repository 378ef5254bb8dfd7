"""One option table: every option of ``%%gpu_offload`` and of ``gpu-offload run`` is a row of it, parsed the same
way by both, and a background run's follower gets every option of its command line back."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from gpu_offload.magics.magic import GpuOffloadMagics

from gpu_offload.cli import build_parser
from gpu_offload.cli.background import child_argv
from gpu_offload.engine.options import MAGIC, NOT_CARRIED, SHELL, TABLE, Option, gpu_amount


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings if flag not in ("-h", "--help")}


def magic_parser() -> argparse.ArgumentParser:
    return GpuOffloadMagics.gpu_offload_cell.parser  # type: ignore[attr-defined, no-any-return]


def run_parser() -> argparse.ArgumentParser:
    parser = build_parser(["run"])
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["run"]  # type: ignore[no-any-return]


def _same(action: argparse.Action, option: Option, default: Any) -> None:
    assert action.dest == option.name, option.flag
    assert action.default == default, option.flag
    if option.switch:
        assert isinstance(action, argparse._StoreTrueAction), option.flag
    else:
        assert action.type is option.type and action.metavar == option.metavar, option.flag


def test_the_magic_offers_exactly_the_table_s_magic_options_as_the_table_says() -> None:
    actions = _actions(magic_parser())
    assert list(actions) == [option.flag for option in MAGIC]
    for option in MAGIC:
        _same(actions[option.flag], option, False if option.switch else None)


def test_gpu_offload_run_offers_exactly_the_table_s_shell_options_as_the_table_says() -> None:
    actions = _actions(run_parser())
    assert list(actions) == [option.flag for option in SHELL]
    for option in SHELL:
        default = False if option.switch else [] if option.repeat else option.shell_default
        _same(actions[option.flag], option, default)


def test_an_option_both_offer_means_the_same_in_both() -> None:
    magic, shell = _actions(magic_parser()), _actions(run_parser())
    both = [option for option in TABLE if option.magic and option.shell]
    assert len(both) >= 15  # the shared options are most of them: the table is what keeps them equal
    for option in both:
        m, s = magic[option.flag], shell[option.flag]
        assert (m.dest, m.type, m.metavar, m.help) == (s.dest, s.type, s.metavar, s.help), option.flag
        assert isinstance(m, argparse._StoreTrueAction) == isinstance(s, argparse._StoreTrueAction), option.flag


def _a_value_for(option: Option) -> list[str]:
    """A command-line value for ``option`` that is not its default."""
    if option.switch:
        return [option.flag]
    if option.shell_choices:
        return [option.flag, next(c for c in option.shell_choices if c != option.shell_default)]
    if option.repeat:
        return [option.flag, "a.csv", option.flag, "b/c.csv"]
    word = {int: "3", float: "2.5", gpu_amount: "3"}.get(option.type, "x-1")  # type: ignore[arg-type]
    return [option.flag, word]


@pytest.mark.parametrize("given", ["every", "none"])
def test_a_background_follower_gets_every_option_of_its_command_line_back(given: str) -> None:
    words = ["run", "--noblock"]
    if given == "every":
        for option in SHELL:
            if option.flag not in NOT_CARRIED:
                words += _a_value_for(option)
    words += ["train.py", "--epochs", "2"]
    args = build_parser(words).parse_args(words)
    follower = child_argv(args, "/tmp/run.log")[3:]  # after "python -m gpu_offload.cli"
    again = build_parser(follower).parse_args(follower)
    assert again.detached_log == "/tmp/run.log" and not again.noblock
    for option in SHELL:
        if option.flag not in NOT_CARRIED:
            assert getattr(again, option.name) == getattr(args, option.name), option.flag
    assert (again.script, again.script_args) == (Path("train.py"), ["--epochs", "2"])
    if given == "every":
        assert again.inputs == [Path("a.csv"), Path("b/c.csv")] and again.gpus == 3 and again.spread


def test_half_a_gpu_and_a_memory_size_reach_a_background_follower() -> None:
    words = ["run", "--noblock", "--gpus", "0.5", "--gpu-memory", "12Gi", "train.py"]
    args = build_parser(words).parse_args(words)
    follower = child_argv(args, "/tmp/run.log")[3:]
    again = build_parser(follower).parse_args(follower)
    assert (again.gpus, again.gpu_memory) == (0.5, "12Gi")
    words = ["run", "--gpus", "2", "train.py"]
    assert build_parser(words).parse_args(words).gpus == 2 and isinstance(build_parser(words).parse_args(words).gpus, int)
