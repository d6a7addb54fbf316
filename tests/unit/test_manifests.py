"""Offline checks of the kustomize tree under manifests/ (no cluster, no kustomize binary).

Every Kubernetes document is validated strictly (unknown fields rejected) against the schemas that
`kubernetes-validate` ships for one pinned Kubernetes version; on top of that the tree's invariants:
kustomizations list exactly their folder's files, Secrets hold only REPLACE placeholders, every container
has CPU/memory requests and limits, every image is pinned, every pod runs as non-root, and every
Secret/ConfigMap key and Service selector that a manifest refers to exists.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2] / "manifests"
K8S_VERSION = "1.30.0"
KUSTOMIZATION_NAMES = {"kustomization.yaml", "kustomization.yml", "Kustomization"}
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}

Doc = dict[str, Any]


def _manifest_files() -> list[Path]:
    files = sorted(p for p in ROOT.rglob("*") if p.suffix in (".yaml", ".yml"))
    return [p for p in files if p.name not in KUSTOMIZATION_NAMES]


def _kustomizations() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*") if p.name in KUSTOMIZATION_NAMES)


def _load(path: Path) -> list[Doc]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        assert isinstance(d, dict), f"{path}: every YAML document must be a mapping"
    return docs


# Kueue's queues (manifests/kueue/, optional): kubernetes-validate has no schema for its CRDs, and ClusterQueue and
# ResourceFlavor are cluster-scoped; tests/unit/test_kueue_example.py checks them
KUEUE_API = "kueue.x-k8s.io/"
ALL_DOCS: list[tuple[Path, Doc]] = [(p, d) for p in _manifest_files() for d in _load(p)
                                    if not str(d.get("apiVersion", "")).startswith(KUEUE_API)]


def _ids() -> list[str]:
    return [f"{p.relative_to(ROOT)}:{d.get('kind')}/{d.get('metadata', {}).get('name')}" for p, d in ALL_DOCS]


def _pod_spec(doc: Doc) -> Doc | None:
    if doc["kind"] == "Pod":
        return doc["spec"]
    if doc["kind"] in POD_TEMPLATE_KINDS:
        return doc["spec"]["template"]["spec"]
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def _containers(doc: Doc) -> Iterator[Doc]:
    spec = _pod_spec(doc)
    if spec is not None:
        yield from spec.get("initContainers", [])
        yield from spec.get("containers", [])


def _of_kind(kind: str) -> list[Doc]:
    return [d for _, d in ALL_DOCS if d["kind"] == kind]


def test_tree_is_not_empty() -> None:
    kinds = {d["kind"] for _, d in ALL_DOCS}
    expected = {
        "Namespace",
        "StatefulSet",
        "Deployment",
        "Service",
        "Secret",
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
    }
    assert expected <= kinds, f"missing kinds: {expected - kinds}"
    assert (ROOT / "base" / "kustomization.yaml").is_file()


def test_kubernetes_validate_ships_pinned_version() -> None:
    assert K8S_VERSION in kubernetes_validate.utils.all_versions()


@pytest.mark.parametrize("path_doc", ALL_DOCS, ids=_ids())
def test_strict_schema(path_doc: tuple[Path, Doc]) -> None:
    path, doc = path_doc
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(x) for x in e.path)
        pytest.fail(f"{path}: {doc['kind']}/{doc['metadata']['name']} invalid at {where}: {e.message}")


def test_strict_schema_rejects_unknown_field() -> None:
    """The validator is really strict: a misspelt field in a container is an error."""
    doc = copy.deepcopy(next(d for d in _of_kind("Deployment")))
    doc["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("kust", _kustomizations(), ids=lambda p: str(p.relative_to(ROOT)))
def test_kustomization_lists_exactly_its_files(kust: Path) -> None:
    k = yaml.safe_load(kust.read_text())
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization", kust
    allowed = {
        "apiVersion",
        "kind",
        "namespace",
        "labels",
        "resources",
        "commonAnnotations",
        "images",
        "patches",
        "configMapGenerator",
        "components",
    }
    assert set(k) <= allowed, f"{kust}: unexpected keys {set(k) - allowed}"
    resources = k.get("resources", [])
    assert len(resources) == len(set(resources)), f"{kust}: duplicate resources"
    for r in resources:
        assert (kust.parent / r).exists(), f"{kust}: resource {r} does not exist"
    local = {p.name for p in kust.parent.iterdir() if p.suffix in (".yaml", ".yml")} - KUSTOMIZATION_NAMES
    files = {r for r in resources if (kust.parent / r).is_file()}
    assert files == local, f"{kust}: resources {sorted(files)} != files in folder {sorted(local)}"


def _expected_namespace(path: Path, doc: Doc) -> str:
    """manifests/sandbox/ (and the sandbox token's template) live in asyncrl-sandbox, everything else in asyncrl."""
    in_sandbox = path.parent.name == "sandbox" or doc["metadata"].get("name") == "asyncrl-sandbox-token"
    return "asyncrl-sandbox" if in_sandbox else "asyncrl"


def test_namespaces() -> None:
    for folder, namespace in (("base", "asyncrl"), ("sandbox", "asyncrl-sandbox")):
        assert yaml.safe_load((ROOT / folder / "kustomization.yaml").read_text())["namespace"] == namespace
    for path, d in ALL_DOCS:
        if d["kind"] != "Namespace":
            want = _expected_namespace(path, d)
            assert d["metadata"].get("namespace") == want, f"{path}: {d['kind']} outside namespace {want}"


def test_secrets_hold_only_placeholders() -> None:
    secrets = _of_kind("Secret")
    assert {s["metadata"]["name"] for s in secrets} == {"asyncrl-s3", "asyncrl-postgres", "asyncrl-role-token",
                                                        "asyncrl-mlflow-auth", "asyncrl-sandbox-token"}
    for s in secrets:
        values = dict(s.get("stringData", {}))
        values.update({k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()})
        assert values, f"Secret {s['metadata']['name']} is empty"
        for key, value in values.items():
            assert value.startswith("REPLACE"), (
                f"Secret {s['metadata']['name']}.{key} holds a non-placeholder"
            )
    s3 = next(s for s in secrets if s["metadata"]["name"] == "asyncrl-s3")
    assert set(s3["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_secrets_are_not_applied_by_kustomize() -> None:
    """`kubectl apply -k` must never overwrite real credentials with placeholders."""
    for kust in _kustomizations():
        for r in yaml.safe_load(kust.read_text()).get("resources", []):
            path = kust.parent / r
            if path.is_file():
                assert all(d["kind"] != "Secret" for d in _load(path)), f"{kust} applies a Secret via {r}"


def test_sandbox_pool_is_locked_down() -> None:
    """The pods that run model-written code: no credential but their own token, no egress, their own user
    namespace, the shipped seccomp profile (equal to the one asyncrl.sandbox.pod_profile builds)."""
    from asyncrl.sandbox.pod_profile import profile_text

    (deploy,) = [d for p, d in ALL_DOCS if p.parent.name == "sandbox" and d["kind"] == "Deployment"]
    spec = deploy["spec"]["template"]["spec"]
    assert spec["hostUsers"] is False and spec["automountServiceAccountToken"] is False
    seccomp = spec["securityContext"]["seccompProfile"]
    assert seccomp["type"] == "Localhost"
    assert (ROOT / "sandbox" / "seccomp" / Path(seccomp["localhostProfile"]).name).read_text() == profile_text()
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", []) if "valueFrom" in e}
    assert secrets == {"asyncrl-sandbox-token"} and "envFrom" not in container
    (pol,) = [d for p, d in ALL_DOCS if p.parent.name == "sandbox" and d["kind"] == "NetworkPolicy"]
    assert pol["spec"]["policyTypes"] == ["Ingress", "Egress"] and pol["spec"]["egress"] == []
    (rule,) = pol["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"]["asyncrl/role"] == "environment"


def test_every_container_has_requests_and_limits() -> None:
    n = 0
    for path, d in ALL_DOCS:
        for c in _containers(d):
            n += 1
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                got = set(res.get(part, {}))
                assert {"cpu", "memory"} <= got, f"{path}: container {c['name']} lacks {part} cpu/memory"
    assert n >= 4


def test_every_image_is_pinned() -> None:
    for path, d in ALL_DOCS:
        for c in _containers(d):
            image = c["image"]
            if "@sha256:" in image:
                continue
            name, _, tag = image.rpartition(":")
            assert name and "/" not in tag, f"{path}: image {image} has no tag"
            assert tag != "latest" and not tag.startswith("latest-"), f"{path}: image {image} is not pinned"


def test_pods_run_as_non_root_without_escalation() -> None:
    for path, d in ALL_DOCS:
        spec = _pod_spec(d)
        if spec is None:
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True, f"{path}: {d['metadata']['name']}"
        assert spec["securityContext"]["runAsUser"] > 0
        for c in _containers(d):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, f"{path}: {c['name']}"
            assert sc["capabilities"]["drop"] == ["ALL"], f"{path}: {c['name']}"


def test_referenced_secret_and_configmap_keys_exist() -> None:
    secret_keys = {
        s["metadata"]["name"]: set(s.get("stringData", {})) | set(s.get("data", {}))
        for s in _of_kind("Secret")
    }
    cm_keys = {c["metadata"]["name"]: set(c.get("data", {})) for c in _of_kind("ConfigMap")}
    refs = 0
    for path, d in ALL_DOCS:
        for c in _containers(d):
            for e in c.get("env", []):
                src = e.get("valueFrom", {})
                for ref_kind, table in (("secretKeyRef", secret_keys), ("configMapKeyRef", cm_keys)):
                    if ref_kind in src:
                        refs += 1
                        name, key = src[ref_kind]["name"], src[ref_kind]["key"]
                        assert key in table.get(name, set()), f"{path}: {c['name']} refers to {name}.{key}"
    assert refs >= 10


def test_services_select_a_workload_port() -> None:
    workloads = [d for _, d in ALL_DOCS if d["kind"] in POD_TEMPLATE_KINDS]
    for svc in _of_kind("Service"):
        sel = svc["spec"]["selector"]
        matches = [w for w in workloads if sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matches) == 1, f"Service {svc['metadata']['name']} selects {len(matches)} workloads"
        ports = {p["name"] for c in _containers(matches[0]) for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, f"Service {svc['metadata']['name']}: no port {p['targetPort']}"


def test_role_server_network_policy() -> None:
    pol = next(p for p in _of_kind("NetworkPolicy") if p["metadata"]["name"] == "asyncrl-role-servers")
    (expr,) = pol["spec"]["podSelector"]["matchExpressions"]
    assert expr == {"key": "asyncrl/role", "operator": "In", "values": ["generation", "reward", "training"]}
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = pol["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "asyncrl"}}}]


def test_runner_rbac_is_least_privilege() -> None:
    (role,) = _of_kind("Role")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        writes = {"create", "delete", "deletecollection", "update"} & set(rule["verbs"])
        # writes: Argo's task results, and the training jobs the multi-node training task creates and deletes
        writable = (["workflowtaskresults"], ["trainjobs"], ["pytorchjobs"])
        assert not writes or rule["resources"] in writable, rule
        if "secrets" in rule["resources"]:
            assert rule.get("resourceNames") and rule["verbs"] == ["get"], rule
    jobs = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            if {"create", "get", "watch", "delete"} <= set(rule["verbs"])}
    assert {("trainer.kubeflow.org", "trainjobs"), ("kubeflow.org", "pytorchjobs")} <= jobs
    (binding,) = _of_kind("RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "asyncrl-runner", "namespace": "asyncrl"}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [sa["metadata"]["name"] for sa in _of_kind("ServiceAccount")] == ["asyncrl-runner"]
