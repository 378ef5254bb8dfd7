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
