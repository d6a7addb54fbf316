"""The multi-node training job objects validate, offline and strictly, against the CRD schemas kept in tests/crds/
(excerpts of the real kubeflow/trainer and kubeflow/training-operator CRDs: tests/crds/README.md), the PyTorchJob's
pod templates against Kubernetes' own PodSpec schema; a misplaced or misspelt field fails."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from asyncrl.cluster.training_job import Owner, TrainingJobSpec, build

CRDS = Path(__file__).resolve().parents[1] / "crds"
K8S_VERSION = "1.30.0"  # as tests/unit/test_manifests.py
SPEC = TrainingJobSpec(name="asyncrl-training-0123456789ab", namespace="asyncrl", image="reg/asyncrl-training:abc",
                       nodes=2, gpus_per_node=8, run_url="s3://asyncrl/runs/run-1",
                       owner=Owner("asyncrl-abc-impl", "6f1c2d3e-4a5b-6c7d-8e9f-000011112222"), kueue_queue="q")
CRD_FILES = {"trainjob": "trainer.kubeflow.org_trainjobs.excerpt.yaml",
             "pytorchjob": "kubeflow.org_pytorchjobs.excerpt.yaml"}


def strict(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever it lists an object's properties (the API server would
    silently prune them: a field in the wrong place would be lost, not refused)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(x) for x in schema]
    return schema


def crd_validator(engine: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((CRDS / CRD_FILES[engine]).read_text())
    (version,) = crd["spec"]["versions"]
    obj = build(SPEC, engine)
    group, ver = obj["apiVersion"].split("/")
    assert (crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"]) == (group, ver, obj["kind"])
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def errors(engine: str, obj: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in crd_validator(engine).iter_errors(obj)]


@pytest.mark.parametrize("engine", ["trainjob", "pytorchjob"])
def test_job_object_is_valid_against_its_crd(engine: str) -> None:
    assert errors(engine, build(SPEC, engine)) == []


@pytest.mark.parametrize("engine", ["trainjob", "pytorchjob"])
def test_a_misplaced_field_is_refused(engine: str) -> None:
    obj = build(SPEC, engine)
    bad = copy.deepcopy(obj)
    bad["spec"]["nodes"] = 2  # no such field
    assert any("nodes" in e for e in errors(engine, bad))
    bad = copy.deepcopy(obj)
    if engine == "trainjob":
        bad["spec"]["trainer"]["numNodes"] = "2"  # the CRD says integer
        (patch,) = bad["spec"]["runtimePatches"]
        node = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {}  # not patchable there
        assert len(errors(engine, bad)) == 2
    else:
        bad["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] = "2"
        assert len(errors(engine, bad)) == 1


def test_pytorchjob_pod_templates_are_valid_pod_specs() -> None:
    obj = build(SPEC, "pytorchjob")
    for name, replica in obj["spec"]["pytorchReplicaSpecs"].items():
        doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{SPEC.name}-{name.lower()}"},
               "template": replica["template"]}
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    bad = copy.deepcopy(obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    bad["spec"]["containers"][0]["env"][0]["valueFrom"]["secretRef"] = {}  # not an EnvVarSource field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                                      "template": bad}, K8S_VERSION, strict=True)


@pytest.mark.parametrize("engine", ["trainjob", "pytorchjob"])
def test_list_map_keys_are_unique_and_metadata_is_sound(engine: str) -> None:
    """What the schemas' x-kubernetes-list-map-keys (env by name) and the metadata rules ask, checked here."""
    obj = build(SPEC, engine)
    containers = ([obj["spec"]["trainer"]] if engine == "trainjob" else
                  [r["template"]["spec"]["containers"][0] for r in obj["spec"]["pytorchReplicaSpecs"].values()])
    for c in containers:
        names = [e["name"] for e in c["env"]]
        assert len(names) == len(set(names)), names
    meta = obj["metadata"]
    assert len(meta["name"]) <= 63 and meta["namespace"] == "asyncrl"
    (owner,) = meta["ownerReferences"]
    assert set(owner) == {"apiVersion", "kind", "name", "uid"} and owner["kind"] == "Pod"
    pod = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}  # ObjectMeta, strictly
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
