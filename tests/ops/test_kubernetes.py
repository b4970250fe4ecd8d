"""deploy/kubernetes, offline: rendered without kubectl, validated against the Kubernetes API schemas
(the `kubernetes-validate` package carries them), and held to docker-compose.yml: the same command, the
same config at the same path, the same variable names.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.config import parse_config
from tests.helpers.recordings import REPO

from .conftest import COMPOSE, CONFIG, ENV_EXAMPLE, VAR_REF, dockerfile_instructions, load_yaml
from .kustomize import Unsupported, render

K8S = REPO / "deploy" / "kubernetes"
# The oldest Kubernetes still in wide use with these APIs (policy/v1, autoscaling/v2 are GA from 1.23)
# and the newest the package knows.
VERSIONS = ("1.27", kubernetes_validate.utils.latest_version())
# .env.example's variables that docker-compose.yml itself consumes or sets, not the gateway's config.
COMPOSE_ONLY = {"GATEWAY_PORT", "REDIS_URL"}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render(K8S)


def _one(rendered: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [r for r in rendered if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [(r["kind"], r["metadata"]["name"]) for r in rendered])
    resource: dict[str, Any] = found[0]
    return resource


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    found: dict[str, Any] = container
    return found


def test_the_kustomization_renders_every_part(rendered: list[dict[str, Any]]) -> None:
    assert Counter((r["kind"], r["metadata"]["name"]) for r in rendered) == Counter(
        {
            ("Deployment", "gateway"): 1,
            ("Service", "gateway"): 1,
            ("PodDisruptionBudget", "gateway"): 1,
            ("HorizontalPodAutoscaler", "gateway"): 1,
            ("ConfigMap", "gateway-config"): 1,
            ("Secret", "gateway-keys"): 1,
            ("Deployment", "redis"): 1,
            ("Service", "redis"): 1,
        }
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_every_resource_is_valid_against_the_kubernetes_schemas(rendered: list[dict[str, Any]], version: str) -> None:
    for resource in rendered:
        # strict: unknown fields are errors too (a misspelt probe field would otherwise pass unseen).
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_schemas_catch_a_broken_manifest(rendered: list[dict[str, Any]]) -> None:
    """The validation above can fail: a misplaced field and a wrong type are both refused."""
    deployment = json.loads(json.dumps(_one(rendered, "Deployment", "gateway")))
    _container(deployment, "gateway")["readinessProbe"]["httpGet"]["paht"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
    deployment = json.loads(json.dumps(_one(rendered, "Deployment", "gateway")))
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    shutil.copytree(K8S, tmp_path / "k")
    path = tmp_path / "k" / "kustomization.yaml"
    path.write_text(path.read_text() + "namePrefix: prod-\n")
    with pytest.raises(Unsupported, match="namePrefix"):
        render(tmp_path / "k")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_renderer_agrees_with_kubectl_kustomize(rendered: list[dict[str, Any]]) -> None:
    result = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    theirs = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]

    def key(r: dict[str, Any]) -> str:
        return json.dumps(r, sort_keys=True)

    assert sorted(map(key, theirs)) == sorted(map(key, rendered))


def test_probes_drain_and_grace_period(rendered: list[dict[str, Any]]) -> None:
    deployment = _one(rendered, "Deployment", "gateway")
    pod = deployment["spec"]["template"]["spec"]
    gateway = _container(deployment, "gateway")
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert ports == {"http": 8080}
    pre_stop = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # The kubelet's SIGKILL comes terminationGracePeriodSeconds after the preStop hook starts: the hook's
    # pause plus the gateway's whole drain must fit, with room to exit.
    config = parse_config(_one(rendered, "ConfigMap", "gateway-config")["data"]["config.yaml"], env={})
    drain_s = math.ceil(config.config.server.shutdown_grace_ms / 1000)
    assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + drain_s + 5
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count


def test_references_between_resources_resolve(rendered: list[dict[str, Any]]) -> None:
    deployment = _one(rendered, "Deployment", "gateway")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = _one(rendered, "Service", "gateway")
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert _one(rendered, "PodDisruptionBudget", "gateway")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = _one(rendered, "HorizontalPodAutoscaler", "gateway")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    assert 1 <= _one(rendered, "PodDisruptionBudget", "gateway")["spec"]["minAvailable"] < hpa["minReplicas"]
    # A CPU utilization target needs a CPU request to be relative to.
    assert _container(deployment, "gateway")["resources"]["requests"]["cpu"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "gateway-config"
    assert [e["secretRef"]["name"] for e in _container(deployment, "gateway")["envFrom"]] == ["gateway-keys"]
    redis = _one(rendered, "Deployment", "redis")
    redis_service = _one(rendered, "Service", "redis")
    assert redis_service["spec"]["selector"].items() <= redis["spec"]["template"]["metadata"]["labels"].items()
    assert not redis_service["spec"]["selector"].items() <= labels.items()  # the gateway's Service is not Redis's


# -- the same gateway as docker-compose.yml ------------------------------------------------------------


def _compose_gateway() -> dict[str, Any]:
    service: dict[str, Any] = load_yaml(COMPOSE)["services"]["gateway"]
    return service


def _image_cmd() -> list[str]:
    (cmd,) = [json.loads(args) for ins, args in dockerfile_instructions() if ins == "CMD"]
    return list(cmd)


def _env_example_names() -> set[str]:
    lines = ENV_EXAMPLE.read_text().splitlines()
    return {line.partition("=")[0] for line in lines if line.strip() and not line.startswith("#")}


def test_the_same_command_as_compose(rendered: list[dict[str, Any]]) -> None:
    compose = _compose_gateway()
    assert "command" not in compose and "entrypoint" not in compose  # compose runs the image's CMD
    gateway = _container(_one(rendered, "Deployment", "gateway"), "gateway")
    assert gateway["command"] == _image_cmd()
    assert "args" not in gateway
    redis = _container(_one(rendered, "Deployment", "redis"), "redis")
    # compose's `command:` replaces the image's CMD, as `args` does; `command` would skip its entrypoint.
    assert redis["args"] == load_yaml(COMPOSE)["services"]["redis"]["command"]
    assert "command" not in redis


def test_the_same_config_at_the_same_path_as_compose(rendered: list[dict[str, Any]]) -> None:
    (mount,) = [v for v in _compose_gateway()["volumes"] if v["target"].endswith("config.yaml")]
    assert (REPO / mount["source"]).resolve() == CONFIG
    config_arg = _image_cmd()[_image_cmd().index("--config") + 1]
    assert mount["target"] == config_arg
    deployment = _one(rendered, "Deployment", "gateway")
    gateway = _container(deployment, "gateway")
    (k8s_mount,) = [m for m in gateway["volumeMounts"] if m["name"] == "config"]
    assert Path(k8s_mount["mountPath"]) / "config.yaml" == Path(config_arg)
    assert "subPath" not in k8s_mount  # a subPath mount never sees a changed ConfigMap
    assert k8s_mount.get("readOnly") is True and mount.get("read_only") is True
    # The copy kustomize reads is the repo's config.yaml, byte for byte.
    assert _one(rendered, "ConfigMap", "gateway-config")["data"] == {"config.yaml": CONFIG.read_text()}


def test_the_same_variables_as_compose(rendered: list[dict[str, Any]]) -> None:
    gateway = _container(_one(rendered, "Deployment", "gateway"), "gateway")
    env = {e["name"]: e["value"] for e in gateway["env"]}
    # Variables compose sets itself, with the same values.
    assert env == _compose_gateway()["environment"]
    secret = _one(rendered, "Secret", "gateway-keys")
    # compose's env_file is .env, made from .env.example: the same names reach the gateway here.
    assert set(secret["data"]) == _env_example_names() - COMPOSE_ONLY
    assert set(secret["data"]).isdisjoint(env)
    # Every ${VAR} of the shipped config is provided.
    referenced = set(VAR_REF.findall(CONFIG.read_text())) - {"VAR"}
    assert referenced <= set(secret["data"]) | set(env), sorted(referenced - set(secret["data"]) - set(env))
    # Never a real key in the repo.
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == dict.fromkeys(secret["data"], b"")
