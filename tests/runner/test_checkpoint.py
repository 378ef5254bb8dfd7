"""A session's state written out and read back by the trust rules: what survives, what does not and why."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from gpu_offload.engine.trust.decode import decode
from gpu_offload.runner import checkpoint
from gpu_offload.runner.checkpoint import CheckpointRefused, CheckpointTooLarge

torch = pytest.importorskip("torch")


def session_namespace() -> dict:
    """A runner's namespace after a few cells: data, a model and its optimizer, a function, a module."""
    ns: dict = {"__name__": "__main__"}
    exec(
        "import math\n"
        "import numpy as np\n"
        "import torch\n"
        "def scale(x):\n    return x * math.pi\n"
        "class Box:\n    def __init__(self, v):\n        self.v = v\n"
        "steps = 3\nname = 'run-7'\narr = np.arange(1000.0)\nbox = Box(5)\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.Adam(model.parameters(), lr=0.1)\n"
        "for _ in range(2):\n"
        "    opt.zero_grad(); model(torch.ones(3, 4)).sum().backward(); opt.step()\n",
        ns,
    )
    return ns


def test_a_trusted_checkpoint_brings_back_data_models_optimizer_state_and_code() -> None:
    ns = session_namespace()
    ns["lock"] = threading.Lock()
    ns["conn"] = socket.socket()  # a connection does not survive a move
    try:
        written = checkpoint.take(ns, "pickle", written_on="donor-1", trusted=True)
    finally:
        ns["conn"].close()
    m = written.manifest
    assert set(m["saved"]) == {"arr", "box", "model", "name", "opt", "scale", "steps", "Box"}
    assert set(m["modules"]) == {"math", "np", "torch"}
    assert "lock" in m["skipped"] and "_thread.lock" in m["skipped"]["lock"]
    assert "conn" in m["skipped"] and "socket" in m["skipped"]["conn"]
    state = checkpoint.restore_trusted(written.data, m, target_trusted=True)
    assert state["steps"] == 3 and state["name"] == "run-7"
    np.testing.assert_array_equal(state["arr"], np.arange(1000.0))
    assert state["scale"](2) == pytest.approx(2 * 3.141592653589793)
    assert state["box"].v == 5 and type(state["box"]).__name__ == "Box"
    model, opt = state["model"], state["opt"]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ns["model"].parameters(), strict=True))
    # the optimizer still drives the very parameters of the model, with its moments
    assert opt.param_groups[0]["params"][0] is model.weight
    assert torch.equal(opt.state[model.weight]["exp_avg"], ns["opt"].state[ns["model"].weight]["exp_avg"])
    before = model.weight.detach().clone()
    opt.zero_grad()
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    assert not torch.equal(before, model.weight)
    assert state["np"] is np and state["math"].pi > 3
    assert "lock" in checkpoint.describe(m) and "not saved" in checkpoint.describe(m)


def test_an_untrusted_donors_checkpoint_is_data_only_and_never_unpickled() -> None:
    ns = session_namespace()
    written = checkpoint.take(ns, "safe", written_on="donor-x", trusted=False)
    m = written.manifest
    assert {"arr", "name", "steps"} <= set(m["saved"])
    for code in ("scale", "Box", "box", "opt"):
        assert code in m["skipped"] and "data only" in m["skipped"][code]
    assert not written.data.startswith(b"\x80")  # not a pickle
    values = decode(written.data).values  # what the kernel does with it: the safe decoders
    assert values["steps"] == 3
    np.testing.assert_array_equal(values["arr"], np.arange(1000.0))
    with pytest.raises(CheckpointRefused, match="data only"):
        checkpoint.restore_trusted(written.data, m, target_trusted=True)


def test_a_pickle_claimed_by_an_untrusted_donor_is_refused() -> None:
    written = checkpoint.take({"x": 1}, "pickle", written_on="donor-x", trusted=False)
    with pytest.raises(CheckpointRefused, match="does not trust"):
        checkpoint.restore_trusted(written.data, written.manifest, target_trusted=True)


def test_a_full_checkpoint_goes_only_to_a_trusted_donor() -> None:
    written = checkpoint.take({"x": 1}, "pickle", written_on="donor-1", trusted=True)
    with pytest.raises(CheckpointRefused, match="trusted donor"):
        checkpoint.restore_trusted(written.data, written.manifest, target_trusted=False)


def test_a_checkpoint_changed_in_storage_is_refused() -> None:
    written = checkpoint.take({"x": list(range(100))}, "pickle", trusted=True)
    tampered = written.data[:-2] + b"X."
    with pytest.raises(CheckpointRefused, match="sha256"):
        checkpoint.restore_trusted(tampered, written.manifest, target_trusted=True)


def test_a_state_over_the_limit_is_refused_whole_with_its_size() -> None:
    with pytest.raises(CheckpointTooLarge, match=r"7\.6 MiB, over the checkpoint limit of 1 MiB"):
        checkpoint.take({"big": np.zeros(1_000_000)}, "pickle", limit=2**20, trusted=True)


def test_underscore_history_and_the_runners_own_names_are_not_state() -> None:
    ns = {"_": 1, "_5": 2, "__builtins__": {}, "display": print, "x": 3}
    assert checkpoint.state_names(ns) == ["x"]


def test_what_holds_a_process_group_is_named_not_saved_and_the_rest_restores_without_a_group() -> None:
    """A DistributedDataParallel wrapper pickles (its __getstate__ drops the group) but cannot be unpickled
    without one, which would lose the whole checkpoint on resume: it, a ProcessGroup and a list holding a wrapper
    are named as not saved with what to do; the module and its optimizer are saved and restore with no group."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(2, 1)
        ddp = DistributedDataParallel(model)
        ns = {"model": model, "ddp": ddp, "opt": torch.optim.SGD(ddp.parameters(), lr=0.1),
              "group": dist.group.WORLD, "wrapped": [ddp], "dist": dist, "n": 3}
        written = checkpoint.take(ns, "pickle", trusted=True)
    finally:
        dist.destroy_process_group()
    manifest = written.manifest
    assert manifest["saved"] == ["model", "n", "opt"] and manifest["modules"] == {"dist": "torch.distributed"}
    assert set(manifest["skipped"]) == {"ddp", "group", "wrapped"}
    assert manifest["skipped"]["ddp"].startswith("torch.nn.parallel.distributed.DistributedDataParallel: holds a "
                                                 "torch.distributed process group")
    assert "call dist.init_process_group() and wrap the module again" in manifest["skipped"]["wrapped"]
    state = checkpoint.restore_trusted(written.data, manifest, target_trusted=True)  # no process group now
    assert state["opt"].param_groups[0]["params"][0] is state["model"].weight and state["n"] == 3
