"""The command's own surface: --version, plain-text help with examples, shell completion from the parsers,
--json listings with RFC 3339 times, and `sandbox --help` without the sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from gpu_offload import cli
from gpu_offload.cli.completion import command_words, script
from gpu_offload.cli.plain import plain_text


def _help(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*words, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"gpu-offload {version('jupyter-gpu-offload')}\n"


@pytest.mark.parametrize("command", [c.name for c in cli.COMMANDS])
def test_every_help_is_plain_text_and_ends_with_examples(capsys: pytest.CaptureFixture[str], command: str) -> None:
    text = _help(capsys, command)
    assert "``" not in text and not any(f":{role}:`" in text for role in ("func", "mod", "data", "meth", "class"))
    examples = text.split("examples:\n", 1)[1].splitlines()
    assert examples and all(line.startswith("  ") and f"gpu-offload {command}" in line for line in examples), text


def test_plain_text_keeps_paragraphs_and_drops_markup() -> None:
    doc = """``gpu-offload x``: see :func:`run` and :mod:`.workdir`.

    A second paragraph::

        indented
    """
    assert plain_text(doc) == "gpu-offload x: see run and workdir.\n\nA second paragraph:\n\n    indented"


def _complete(script_text: str, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one being completed), with the generated script sourced."""
    program = (f"{script_text}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
               "_gpu_offload; printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


@pytest.mark.e2e  # starts bash
def test_bash_completes_commands_options_and_actions(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", "bash"]) == 0
    text = capsys.readouterr().out
    assert sorted(_complete(text, "gpu-offload", "ru")) == ["run", "runs"]
    assert "--version" in _complete(text, "gpu-offload", "--")
    assert _complete(text, "gpu-offload", "runs", "--j") == ["--json"]
    assert _complete(text, "gpu-offload", "queues", "sy") == ["sync"]
    assert "--follow" in _complete(text, "gpu-offload", "logs", "-")


def test_the_zsh_script_is_the_bash_one_behind_bashcompinit() -> None:
    words = command_words(["runs"], cli.build_parser)
    zsh = script("zsh", ("runs",), words)
    assert zsh.startswith("#compdef gpu-offload\n") and "bashcompinit" in zsh
    assert script("bash", ("runs",), words) in zsh
    with pytest.raises(ValueError, match="choose one of bash, zsh"):
        script("fish", (), words)


@pytest.mark.e2e  # starts a process
def test_sandbox_help_imports_nothing_of_the_sandbox() -> None:
    program = ("import sys\nfrom gpu_offload import cli\ntry:\n    cli.main(['sandbox', '--help'])\n"
               "except SystemExit:\n    pass\n"
               "print([m for m in sys.modules if m.startswith('gpu_offload.sandbox.') or m == 'aiohttp'])")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True)
    assert "--donors" in done.stdout and "--kueue" in done.stdout  # the whole help is there...
    assert done.stdout.strip().splitlines()[-1] == "['gpu_offload.sandbox.arguments']"  # ...and only its options


def test_runs_json_gives_rfc3339_times(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_offload.liqo_peering.timestamps import parse_time, rfc3339

    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z" and rfc3339(None) is None
    assert parse_time(rfc3339(1764238325.5)).timestamp() == 1764238325.5  # type: ignore[union-attr]
    from gpu_offload.cli.runs import as_json
    from gpu_offload.engine.runs.records import RunEntry

    record = RunEntry("run-1", "kernel-a", 1, "local", "local", 0, state="done", started=1764238325.25,
                      ended=1764238330.0)
    shown: dict[str, Any] = as_json(record, 1764238400.0)
    assert (shown["started"], shown["ended"]) == ("2025-11-27T10:12:05.250Z", "2025-11-27T10:12:10.000Z")
    json.dumps(shown)


def test_doctor_json_without_a_cluster_says_the_local_backend(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("KUBECONFIG", "GPU_OFFLOAD_BACKEND", "GPU_OFFLOAD_NAMESPACE", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(key, raising=False)
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0 and [c["what"] for c in report["checks"]] == ["backend"]
    assert report["checks"][0]["status"] == "OK" and "local backend" in report["checks"][0]["text"]


def test_donor_check_reads_only_liqos_twin_namespaces_and_asks_at_least_the_expected_level() -> None:
    from gpu_offload.cli.donor import report

    def ns(name: str, level: str | None, twin: bool = True, origin: str = "o1") -> dict[str, object]:
        labels = {"liqo.io/remote-cluster-id": origin, **({"pod-security.kubernetes.io/enforce": level} if level else {})}
        annotations = {"liqo.io/managed-by-namespace-map": "t/m"} if twin else {}
        return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}

    lines = report([ns("a", "privileged"), ns("b", "baseline"), ns("c", None, twin=False), ns("d", "x", origin="o2")],
                   "baseline", None)
    assert [(line.namespace, line.status) for line in lines] == [("a", "FAIL"), ("b", "OK"), ("d", "FAIL")]
    assert [line.namespace for line in report([ns("a", "baseline"), ns("d", None, origin="o2")], "baseline", "o2")] == ["d"]
    (empty,) = report([ns("c", None, twin=False)], "restricted", None)
    assert empty.status == "WARN" and "nothing to check" in empty.text
