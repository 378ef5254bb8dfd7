"""``gpu-offload completion bash|zsh``: a shell completion script for the command, built from its parsers.

    source <(gpu-offload completion bash)      # or add it to ~/.bashrc
    source <(gpu-offload completion zsh)       # zsh, through its bash completion layer

It completes sub-commands, their options and their actions (``queues sync``); it reads every sub-command's
parser once, when the script is made, never while you type.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

SHELLS = ("bash", "zsh")


@dataclass(frozen=True)
class Words:
    """What can follow one sub-command: its options and its actions."""

    command: str
    options: tuple[str, ...]
    actions: tuple[str, ...] = ()


def words_of(parser: argparse.ArgumentParser) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The option strings and sub-command names of ``parser``."""
    options: list[str] = []
    actions: list[str] = []
    for action in parser._actions:  # argparse keeps no public list of them
        options.extend(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            actions.extend(action.choices)
    return tuple(sorted(set(options))), tuple(actions)


def command_words(commands: Iterable[str], build: Any) -> list[Words]:
    """For each of ``commands``, its words, from ``build([command])`` (the full parser for that command)."""
    found = []
    for name in commands:
        parser = build([name])
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        options, actions = words_of(sub)
        found.append(Words(name, options, actions))
    return found


def bash_script(top: Sequence[str], commands: Sequence[Words]) -> str:
    """A bash completion function for ``gpu-offload``: ``top`` are the words after the program name."""
    cases = "\n".join(
        f"        {shlex.quote(w.command)}) words={shlex.quote(' '.join((*w.actions, *w.options)))} ;;"
        for w in commands)
    return f"""# bash completion for gpu-offload (made by `gpu-offload completion bash`)
_gpu_offload() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" command="" words="" word
    for word in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        case "$word" in -*) ;; *) command="$word"; break ;; esac
    done
    case "$command" in
        "") words={shlex.quote(' '.join(top))} ;;
{cases}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -F _gpu_offload gpu-offload
"""


def zsh_script(top: Sequence[str], commands: Sequence[Words]) -> str:
    """The same for zsh, through its bash completion layer (bashcompinit)."""
    return ("#compdef gpu-offload\n# zsh completion for gpu-offload (made by `gpu-offload completion zsh`)\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(top, commands))


def script(shell: str, top: Sequence[str], commands: Sequence[Words]) -> str:
    """The completion script for ``shell``."""
    if shell not in SHELLS:
        raise ValueError(f"no completion for {shell!r}: choose one of {', '.join(SHELLS)}")
    return (bash_script if shell == "bash" else zsh_script)(top, commands)


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``completion`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("completion", help=summary, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the script."""
    from gpu_offload import cli

    names = [c.name for c in cli.COMMANDS]
    top = (*names, "--help", "--version")
    sys.stdout.write(script(args.shell, top, command_words(names, cli.build_parser)))
    return 0
