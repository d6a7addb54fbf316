"""manifests/kueue/queues.yaml, the example Kueue queues for gang admission (README "Sizing and scheduling"):
kubernetes-validate has no schema for Kueue's CRDs, so this checks what Kueue would: each document's kind and
required fields, the LocalQueue points at the ClusterQueue, every flavor exists and covers exactly the covered
resources with valid quantities, the ClusterQueue admits the namespace's pods, and its quota holds the compiled
pipeline's default pods all at once (a pod group is admitted whole or not at all)."""

from pathlib import Path

import yaml

from asyncrl.cluster.pipeline.pods import QUANTITY, current_layout
from asyncrl.cluster.pipeline_cli import DEFAULT_YAML

ROOT = Path(__file__).resolve().parents[2]
QUEUES = ROOT / "manifests" / "kueue" / "queues.yaml"
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}


def _amount(q: object) -> float:
    text = str(q)
    assert QUANTITY.match(text), text
    for suffix in sorted(UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * UNITS[suffix]
    return float(text)


def _docs() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(QUEUES.read_text()) if d]
    assert all(d["apiVersion"] == "kueue.x-k8s.io/v1beta1" for d in docs)
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["ClusterQueue", "LocalQueue", "ResourceFlavor"] and len(docs) == 3
    return by_kind


def test_the_queues_fit_together():
    docs = _docs()
    local, cluster, flavor = docs["LocalQueue"], docs["ClusterQueue"], docs["ResourceFlavor"]
    assert local["metadata"]["namespace"] == "asyncrl" and "namespace" not in cluster["metadata"]
    assert local["spec"]["clusterQueue"] == cluster["metadata"]["name"]
    assert cluster["spec"]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "asyncrl"}
    for group in cluster["spec"]["resourceGroups"]:
        for f in group["flavors"]:
            assert f["name"] == flavor["metadata"]["name"]
            assert [r["name"] for r in f["resources"]] == group["coveredResources"]
            assert all(_amount(r["nominalQuota"]) > 0 for r in f["resources"])
    assert current_layout().kueue_queue in ("", local["metadata"]["name"])


def test_the_quota_holds_the_default_pipeline_at_once():
    params = next(yaml.safe_load_all(DEFAULT_YAML.read_text()))["root"]["inputDefinitions"]["parameters"]

    def default(name: str) -> object:
        return params[name]["defaultValue"]

    gen, env = len(default("generation_replica_ids")), len(default("environment_replica_ids"))
    pods = {"generation": gen, "training": 1, "reward": 1, "environment": env, "setup": 1}
    need = {"cpu": sum(n * _amount(default(f"{r}_cpu_request")) for r, n in pods.items()),
            "memory": sum(n * _amount(default(f"{r}_memory_request")) for r, n in pods.items()),
            "nvidia.com/gpu": gen * default("generation_gpus") + default("training_gpus")}
    (group,) = _docs()["ClusterQueue"]["spec"]["resourceGroups"]
    quota = {r["name"]: _amount(r["nominalQuota"]) for r in group["flavors"][0]["resources"]}
    assert all(need[k] <= quota[k] for k in need), (need, quota)
