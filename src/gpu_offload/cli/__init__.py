"""The ``gpu-offload`` command: each sub-command is a module of this package, listed once in :data:`COMMANDS`.

Only the chosen sub-command's module is imported: ``gpu-offload --help`` lists the commands from
:data:`COMMANDS` alone, so it does not load the Kubernetes client, the sandbox or Jupyter (see
bench/bench_cli.py for the time it takes).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .plain import PlainParser


@dataclass(frozen=True)
class Command:
    """One sub-command: its name, its line in ``gpu-offload --help``, and the command lines its own ``--help``
    ends with. Its module, ``gpu_offload.cli.<name>``, defines ``add_parser(subparsers, summary)``, which
    registers ``name`` with a ``func`` default."""

    name: str
    summary: str
    examples: tuple[str, ...] = ()
    extra: str = ""
    """The package extra it needs beyond the base install (its imports fail without it), if any."""

    @property
    def module(self) -> str:
        return f"{__name__}.{self.name}"


COMMANDS: tuple[Command, ...] = (
    Command("quickstart", "run examples/quickstart.ipynb on an embedded SANDBOX cluster (--local: no cluster)",
            ("gpu-offload quickstart", "gpu-offload quickstart --local --output executed.ipynb"), extra="sandbox"),
    Command("lab", "JupyterLab (or JupyterHub with --hub) against an embedded SANDBOX cluster",
            ("gpu-offload lab", "gpu-offload lab --hub"), extra="lab"),
    Command("clusters", "list peered clusters, their virtual nodes and free GPUs",
            ("gpu-offload clusters", "gpu-offload clusters --json")),
    Command("queues", "show or sync the Kueue queue of the GPU pool",
            ("gpu-offload queues", "gpu-offload queues --json", "gpu-offload queues sync --dry-run")),
    Command("sandbox", "serve an emulated Kubernetes API (a SANDBOX, not a cluster)",
            ("gpu-offload sandbox --kubeconfig /tmp/sandbox.kubeconfig --donors 2 --gpus 4",), extra="sandbox"),
    Command("cleanup", "delete runner pods and Secrets left by your kernels",
            ("gpu-offload cleanup", "gpu-offload cleanup --kernel KERNEL_ID")),
    Command("run", "run a Python script on a GPU runner and stream its output (exits with its exit code)",
            ("gpu-offload run train.py --epochs 3", "gpu-offload run --gpus 2 --gpu-model A100 --noblock train.py")),
    Command("runs", "list your runs: cells of every kernel and scripts, with state, cluster, GPUs and age",
            ("gpu-offload runs", "gpu-offload runs --json")),
    Command("logs", "print a run's output (-f: follow it until the run ends)", ("gpu-offload logs -f RUN",)),
    Command("cancel", "stop a run (a script's or a notebook cell's) as Ctrl-C would", ("gpu-offload cancel RUN",)),
    Command("doctor", "check the cluster setup (kubeconfig, namespace, offloading, storage, GPUs) and say how to fix it",
            ("gpu-offload doctor", "gpu-offload doctor --json")),
    Command("donor", "on a donor cluster: check that Liqo's namespaces for origins enforce their Pod Security level",
            ("gpu-offload donor check",
             "gpu-offload donor check --expect restricted --origin ORIGIN_CLUSTER_ID --json")),
    Command("completion", "print a bash or zsh completion script for gpu-offload",
            ("source <(gpu-offload completion bash)", "source <(gpu-offload completion zsh)")),
)


def _chosen(argv: Sequence[str]) -> Command | None:
    """The sub-command ``argv`` names (the first word that is not an option), if it is one we have."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return next((c for c in COMMANDS if c.name == first), None)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command listed, only the one ``argv`` names built in full."""
    parser = PlainParser(
        prog="gpu-offload",
        description="Run Jupyter cells and Metaflow steps on remote GPUs through Liqo.",
        epilog="examples:\n  gpu-offload quickstart\n  gpu-offload runs --json\n  gpu-offload COMMAND --help",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=PlainParser)
    chosen = _chosen(argv)
    for command in COMMANDS:
        if command is chosen:
            importlib.import_module(command.module).add_parser(subparsers, command.summary)
            if command.examples:
                subparsers.choices[command.name].epilog = "examples:\n" + "\n".join(
                    f"  {e}" for e in command.examples)
        else:
            subparsers.add_parser(command.name, help=command.summary)
    return parser


def _version() -> str:
    """The installed distribution's version (what pip shows)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jupyter-gpu-offload")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _missing_extra(command: Command | None, exc: ModuleNotFoundError) -> int:
    """Say which extra to install when a command's module needs a package the base install leaves out."""
    if command is None or not command.extra:
        raise exc
    print(f"gpu-offload {command.name}: {exc.name} is not installed; it comes with the package's "
          f"{command.extra} extra: pip install 'jupyter-gpu-offload[{command.extra}]' (from a checkout: "
          f"pip install -e '.[{command.extra}]')", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen(words)
    try:
        parser = build_parser(words)
        args = parser.parse_args(words)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        return _missing_extra(chosen, exc)


if __name__ == "__main__":
    sys.exit(main())
