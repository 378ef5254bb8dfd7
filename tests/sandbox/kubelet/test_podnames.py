"""The hosts file a pod gets: which names reach which address, from which namespace (pure builder)."""

from __future__ import annotations

from gpu_offload.sandbox.kubelet import podnames

READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def _pod(name: str, ns: str, ip: str, ready: bool = True, **spec) -> dict:
    status = {**READY, "podIP": ip} if ready else {"phase": "Pending", "podIP": ip}
    return {"metadata": {"name": name, "namespace": ns, "labels": {"app": "db"}}, "spec": spec, "status": status}


def _svc(name: str, ns: str, cluster_ip: str) -> dict:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"clusterIP": cluster_ip, "selector": {"app": "db"}}}


def _lines(text: str) -> dict[str, str]:
    return {name: line.split("\t")[0] for line in text.splitlines() if not line.startswith("#")
            for name in line.split("\t")[1].split()}


def test_short_names_only_from_the_services_namespace_and_only_ready_endpoints():
    pods = [_pod("db-0", "data", "10.200.0.5", hostname="db-0", subdomain="db"),
            _pod("db-1", "data", "10.200.0.6", ready=False, hostname="db-1", subdomain="db")]
    table = podnames.entries([_svc("api", "data", "10.96.0.20"), _svc("db", "data", "None")], pods)
    same = _lines(podnames.hosts_file(_pod("client", "data", "10.200.0.9"), "10.200.0.9", table))
    other = _lines(podnames.hosts_file(_pod("client", "web", "10.200.0.8"), "10.200.0.8", table))
    assert same["api"] == same["api.data"] == same["api.data.svc.cluster.local"] == "10.96.0.20"
    assert same["db"] == same["db-0.db"] == same["db-0.db.data.svc.cluster.local"] == "10.200.0.5"
    assert "db-1.db" not in same and "db-1.db.data.svc.cluster.local" not in same  # not ready: not published
    assert "api" not in other and "db-0.db" not in other and other["api.data"] == "10.96.0.20"
    assert other["client"] == "10.200.0.8" and other["ip6-localhost"] == "::1"


def test_a_pod_with_a_subdomain_names_itself_as_a_kubelet_does():
    pod = _pod("web-0", "team", "10.200.0.7", hostname="web-0", subdomain="web")
    text = podnames.hosts_file(pod, "10.200.0.7", [])
    assert "10.200.0.7\tweb-0.web.team.svc.cluster.local\tweb-0\n" in text
    assert podnames.resolv_conf("team").startswith("search team.svc.cluster.local svc.cluster.local cluster.local\n")


def test_a_headless_service_publishing_not_ready_addresses_names_pods_before_they_are_ready():
    # a distributed run's ranks rendezvous at rank 0 while every pod is still starting
    starting = _pod("job-0", "data", "10.200.0.5", ready=False, hostname="job-0", subdomain="db")
    ended = {**_pod("job-1", "data", "10.200.0.6", hostname="job-1", subdomain="db"),
             "status": {"phase": "Failed", "podIP": "10.200.0.6"}}
    svc = _svc("db", "data", "None")
    svc["spec"]["publishNotReadyAddresses"] = True
    names = _lines(podnames.hosts_file(_pod("client", "data", "10.200.0.9"), "10.200.0.9",
                                       podnames.entries([svc], [starting, ended])))
    assert names["db"] == names["job-0.db"] == "10.200.0.5"
    assert "job-1.db" not in names  # an ended pod is no endpoint, publishing or not
    plain = _lines(podnames.hosts_file(_pod("client", "data", "10.200.0.9"), "10.200.0.9",
                                       podnames.entries([_svc("db", "data", "None")], [starting])))
    assert "db" not in plain


def test_a_pod_on_a_donor_sees_the_offloaded_namespaces_under_their_twins_names():
    # Liqo reflects an offloaded namespace's Services into its twin on the donor (<ns>-origin by default):
    # there the short name and the twin's names resolve, the origin's fully qualified ones do not
    from gpu_offload.sandbox.liqo.offloading import donor_namespaces

    node = {"metadata": {"name": "donor-1-gpu", "labels": {"liqo.io/type": "virtual-node",
                                                            "liqo.io/remote-cluster-id": "donor-1"}}}
    offloadings = [{"metadata": {"name": "offloading", "namespace": "data"}, "spec": {}},
                   {"metadata": {"name": "offloading", "namespace": "kept"},
                    "spec": {"namespaceMappingStrategy": "EnforceSameName"}},
                   {"metadata": {"name": "offloading", "namespace": "elsewhere"}, "spec": {"clusterSelector": {
                       "nodeSelectorTerms": [{"matchExpressions": [{"key": "liqo.io/remote-cluster-id",
                                                                    "operator": "In", "values": ["donor-2"]}]}]}}}]
    twins = donor_namespaces(offloadings, node)
    assert twins == {"data": "data-origin", "kept": "kept"}
    table = podnames.entries([_svc("db", "data", "None"), _svc("web", "elsewhere", "10.96.0.7")],
                             [_pod("db-0", "data", "10.200.0.5")])
    names = _lines(podnames.hosts_file(_pod("rank", "data", "10.200.0.9"), "10.200.0.9",
                                       podnames.renamed(table, twins), "data-origin"))
    assert names["db"] == names["db.data-origin.svc.cluster.local"] == "10.200.0.5"
    assert "db.data.svc.cluster.local" not in names and "web.elsewhere" not in names
    assert podnames.resolv_conf("data-origin").startswith("search data-origin.svc.cluster.local ")


def test_the_pods_nameserver_says_no_such_name_to_every_question():
    from gpu_offload.sandbox.kubelet.poddns import reply

    # "rank0.svc" type PTR: id 0x1234, RD set
    question = b"\x05rank0\x03svc\x00" + b"\x00\x0c\x00\x01"
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + question
    answer = reply(query)
    assert answer == b"\x12\x34\x85\x83\x00\x01\x00\x00\x00\x00\x00\x00" + question  # QR AA RD RA, NXDOMAIN
    assert reply(answer) is None  # a response is never answered
    assert reply(b"\x00\x01") is None
    assert reply(query[:12] + b"\x05ran")[2:4] == b"\x85\x81"  # a question cut short: FORMERR
