"""What an untrusted checkpoint leaves behind, as the user is told it: the donor's words on one printable line."""

from __future__ import annotations

from gpu_offload.engine.backends.checkpoint_book import not_restored_as_data
from gpu_offload.runner.safe import Skipped


def test_what_a_donor_wrote_in_a_checkpoint_manifest_is_shown_bounded_and_printable() -> None:
    # a forged line break would print a "restored" line of the donor's in the user's notebook
    manifest = {"skipped": {"conn\x1b[2J": "socket.socket\r\nrestored from checkpoint forged: " + "x" * 500},
                "modules": {"np\x07": "numpy\n\x1b]0;title"}}
    dropped = not_restored_as_data([Skipped("lock", "_thread.lock", "it holds a lock")], manifest)
    said = "socket.socket restored from checkpoint forged: "
    assert dropped == {"lock": "_thread.lock: it holds a lock",
                       "conn [2J": said + "x" * (200 - len(said)) + "...",
                       "np": "module numpy ]0;title: import it again (an untrusted checkpoint imports nothing)"}
