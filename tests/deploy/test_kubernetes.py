"""deploy/kubernetes: the MirrorMaker 2 sidecar example is valid against the Kubernetes
schemas (kubernetes-validate, strict, offline) and agrees with corrfix's own options."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml

from corrfix._cli import _with_config_file, build_parser, proxy_config_from_args
from corrfix.core import Address
from corrfix.proxy._config_env import env_variables
from tests.deploy.conftest import DEPLOY

MANIFEST = DEPLOY / "kubernetes" / "mirrormaker-sidecar.yaml"
# Native sidecars (an init container with restartPolicy: Always) need 1.29; and the newest schema.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def documents() -> list[dict]:
    return list(yaml.safe_load_all(MANIFEST.read_text()))


def pod_spec() -> dict:
    (deployment,) = [doc for doc in documents() if doc["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


def corrfix_container() -> dict:
    (sidecar,) = [c for c in pod_spec()["initContainers"] if c["name"] == "corrfix"]
    return sidecar


@pytest.mark.parametrize("version", VERSIONS)
def test_every_resource_is_valid_in_strict_mode(version):
    for document in documents():
        kubernetes_validate.validate(document, version, strict=True)


def test_a_misspelled_field_would_fail():
    broken = copy.deepcopy(documents()[1])
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_the_sidecar_is_probed_and_outlives_its_drain():
    sidecar = corrfix_container()
    assert sidecar["restartPolicy"] == "Always"
    env = {item["name"]: item["value"] for item in sidecar["env"]}
    assert pod_spec()["terminationGracePeriodSeconds"] > float(env["CORRFIX_DRAIN_TIMEOUT"])
    metrics_port = Address.parse(env["CORRFIX_METRICS"]).port
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {"metrics": metrics_port}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}


def test_the_sidecar_settings_are_corrfix_settings_and_mirrormaker_uses_them():
    sidecar = corrfix_container()
    env = {item["name"]: item["value"] for item in sidecar["env"]}
    parser = build_parser()
    assert set(env) <= set(env_variables(parser._proxy_parser))
    argv = ["proxy", *sidecar["args"]]
    args = _with_config_file(parser, parser.parse_args(argv), argv, env)
    config = proxy_config_from_args(args)
    assert args.setting_sources["upstream"] == "env CORRFIX_UPSTREAM"
    (config_map,) = [doc for doc in documents() if doc["kind"] == "ConfigMap"]
    properties = dict(
        line.split(" = ", 1) for line in config_map["data"]["mm2.properties"].splitlines() if " = " in line
    )
    assert Address.parse(properties["source.bootstrap.servers"]) == config.listen
