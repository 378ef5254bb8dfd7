"""Bad values for the magic's options are refused with what to write instead."""

from __future__ import annotations

import pytest

from gpu_offload.engine.errors import OffloadUsageError
from gpu_offload.engine.request import OffloadRequest, split_names


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"gpus": -1}, r"--gpus -1: the number of GPUs cannot be negative\. Write --gpus 1"),
        ({"timeout": 0.0}, r"--timeout 0: the timeout must be a positive number"),
        ({"backend": "slurm"}, r"--backend slurm: unknown backend\. Write --backend local"),
        ({"inputs": ("a", "2b")}, r"--in a,2b: `2b` is not a Python variable name"),
        ({"outputs": ("class",)}, r"--out class: `class` is not a Python variable name"),
        ({"session": "my session"}, r"--session 'my session': a session name uses letters"),
        ({"priority": "Batch"}, r"--priority 'Batch': a priority class is a lowercase name .* e.g. --priority batch"),
        ({"idle_timeout": 600.0}, r"--idle-timeout 10: only a session is released when idle; add --session NAME"),
        ({"idle_timeout": -60.0, "session": "s"}, r"--idle-timeout -1: give a positive number of minutes"),
        ({"idle_timeout": float("inf"), "session": "s"}, r"--idle-timeout inf: give a positive number of minutes"),
    ],
)
def test_invalid_fields_raise_a_usage_error_naming_the_fix(fields: dict[str, object], message: str) -> None:
    with pytest.raises(OffloadUsageError, match=message):
        OffloadRequest(cell="pass", **fields)  # type: ignore[arg-type]


def test_requests_are_frozen() -> None:
    request = OffloadRequest(cell="pass")
    with pytest.raises(AttributeError):
        request.gpus = 2  # type: ignore[misc]


def test_split_names_ignores_spaces_and_empty_items() -> None:
    assert split_names(" a, b,,c ") == ("a", "b", "c")
    assert split_names(None) == ()


def test_gpus_option_splits_into_whole_gpus_or_part_of_one() -> None:
    from gpu_offload.engine.request import gpus_and_fraction, memory_size

    assert gpus_and_fraction(0.5) == (1, 0.5)
    assert gpus_and_fraction(2) == (2, None) and gpus_and_fraction(0) == (0, None)
    with pytest.raises(OffloadUsageError, match=r"--gpus 1.5 mixes whole GPUs and a fraction.*--gpus 2"):
        gpus_and_fraction(1.5)
    assert memory_size("12Gi") == 12 * 2**30 and memory_size(None) is None
    with pytest.raises(OffloadUsageError, match="--gpu-memory 'twelve' is not a size of memory. Write it like 12Gi"):
        memory_size("twelve")


@pytest.mark.parametrize(("fields", "message"), [
    ({"fraction": 0.5, "nodes": 2}, "--gpus 0.5 with --nodes: the ranks of a distributed run each hold whole GPUs"),
    ({"gpu_memory": 2**30, "gpus": 2}, "--gpu-memory with --gpus 2: they ask for part of one GPU"),
    ({"fraction": 1.5}, "part of a GPU is more than 0 and less than 1"),
])
def test_a_fraction_is_part_of_one_gpu_for_one_runner(fields: dict[str, object], message: str) -> None:
    with pytest.raises(OffloadUsageError, match=message):
        OffloadRequest(cell="x = 1", **fields)  # type: ignore[arg-type]
