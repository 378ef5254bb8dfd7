"""The magic's fixtures (a real shell, a real kernel, the check that no runner is left behind) here too."""

from ..magics.conftest import backend, kernel, no_runner_left_behind, shell  # noqa: F401 (fixtures by name)
