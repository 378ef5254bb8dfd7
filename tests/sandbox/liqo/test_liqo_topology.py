"""The seeded Liqo objects are what Liqo itself would write: they validate against the real CRDs (read from
../shared/liqo-crds, never copied) and, for built-in kinds, against the real Kubernetes schema."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
from gpu_offload.sandbox.apiserver import crds
from gpu_offload.sandbox.liqo import seed as liqo

SHARED_CRDS = Path(__file__).resolve().parents[3] / ".." / "shared" / "liqo-crds"


@pytest.fixture(scope="module")
def real_crds() -> list[dict]:
    return crds.load_crd_dir(SHARED_CRDS)


def test_every_seeded_liqo_object_validates_against_the_real_crds(real_crds):
    objects = liqo.topology(liqo.donors(3, gpus=4, gpu_model="A100"))
    custom = [o for o in objects if o["apiVersion"] != "v1"]
    assert {o["kind"] for o in custom} == {"ForeignCluster", "ResourceSlice", "VirtualNode"}
    for obj in custom:
        assert crds.schema_errors(obj, real_crds) == [], obj["metadata"]["name"]
        assert crds.schema_errors(obj, crds.builtin_crds()) == [], obj["metadata"]["name"]


def test_builtin_kinds_validate_strictly_against_the_kubernetes_schema():
    for obj in liqo.topology(liqo.donors(2)):
        if obj["apiVersion"] == "v1":
            kubernetes_validate.validate(obj, "1.33", strict=True)


def test_builtin_description_names_the_same_kinds_as_the_real_crds(real_crds):
    real = {(k.api_version, k.kind, k.plural, k.namespaced) for k in crds.kinds_of(real_crds).values()}
    own = {(k.api_version, k.kind, k.plural, k.namespaced) for k in crds.kinds_of(crds.builtin_crds()).values()}
    assert own <= real


def test_real_crds_reject_what_liqo_would_reject(real_crds):
    fc = liqo.foreign_cluster(liqo.donors(1)[0])
    fc["status"]["role"] = "Lender"
    fc["spec"]["clusterID"] = "Not_An_ID"
    errors = crds.schema_errors(fc, real_crds)
    assert any(e.startswith("status.role:") for e in errors)
    assert any(e.startswith("spec.clusterID:") for e in errors)
    # the built-in description checks the same fields, so a package without the CRDs still catches them
    assert len(crds.schema_errors(fc, crds.builtin_crds())) == 2


def test_virtual_node_carries_liqo_taint_labels_gpu_capacity_model_and_price():
    donor = liqo.Donor("acme", gpus=8, gpu_model="H100", price_per_gpu_hour="3.10")
    node = liqo.virtual_node_node(donor, 0)
    labels = node["metadata"]["labels"]
    assert labels["liqo.io/type"] == "virtual-node"
    assert labels["liqo.io/remote-cluster-id"] == "acme"
    assert labels[liqo.GPU_MODEL_LABEL] == "H100"
    assert labels[liqo.PRICE_KEY] == "3.10"
    assert node["metadata"]["annotations"][liqo.PRICE_KEY] == "3.10"
    assert node["spec"]["taints"] == [{"key": "virtual-node.liqo.io/not-allowed", "value": "true",
                                       "effect": "NoExecute"}]
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_local_nodes_have_no_gpu_and_one_takes_user_pods():
    nodes = liqo.local_nodes()
    assert all("nvidia.com/gpu" not in n["status"]["capacity"] for n in nodes)
    assert all(not n["spec"].get("taints") for n in nodes)
    users = [n for n in nodes if n["metadata"]["labels"].get("hub.jupyter.org/node-purpose") == "user"]
    assert [n["metadata"]["name"] for n in users] == [liqo.USER_NODE]


def test_donors_get_distinct_ids_and_prices_and_bad_counts_are_refused():
    ds = liqo.donors(3, gpus=2, gpu_model="L4")
    assert len({d.cluster_id for d in ds}) == 3
    assert len({d.price_per_gpu_hour for d in ds}) == 3
    with pytest.raises(ValueError, match="one per donor"):
        liqo.donors(2, prices=("1.00",))
    with pytest.raises(ValueError, match=">= 0"):
        liqo.donors(-1)


def test_capacity_follows_the_granted_slice_only():
    rs = liqo.resource_slice(liqo.donors(1, gpus=4)[0])
    assert liqo.capacity_from_slice(rs)["nvidia.com/gpu"] == "4"
    rs["status"]["conditions"][1]["status"] = "Denied"
    assert liqo.capacity_from_slice(rs) is None


def test_crd_folder_errors_name_the_folder_and_the_fix(tmp_path):
    with pytest.raises(crds.CRDError, match="does not exist: pass --crds"):
        crds.load_crd_dir(tmp_path / "missing")
    (tmp_path / "x.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(crds.CRDError, match="holds no CustomResourceDefinition"):
        crds.load_crd_dir(tmp_path)
