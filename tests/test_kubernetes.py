"""deploy/kubernetes/ and `collbench rules --format prometheusrule`, validated against the upstream
APIs with what a user's machine has (./scripts/install.sh installs it, nothing beside the clone is read):
- built-in kinds: the Kubernetes API's schemas (kubernetes-validate, strict);
- Prometheus Operator kinds: decoded strictly into the operator's published Go API types by
  tools/k8s-validate (built by install.sh into .venv/bin; unknown field, wrong type, bad duration);
- MPIJob (the MPI Operator publishes no Go module or package a registry serves): the envelope
  against tools/k8s-schemas/mpijob-v2beta1.schema.json, written from its v2beta1 API, and its
  metadata and pod templates against kubernetes-validate's ObjectMeta and PodTemplateSpec.
The kustomization is rendered by the small kustomize subset below (what deploy/kubernetes uses);
kustomize's own library (k8s-validate -kustomize, what `kubectl kustomize` runs) must agree."""

import copy
import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KDIR = os.path.join(REPO, "deploy", "kubernetes")
VALIDATOR = os.path.join(os.path.dirname(sys.executable), "k8s-validate")
MPIJOB_SCHEMA = os.path.join(REPO, "tools", "k8s-schemas", "mpijob-v2beta1.schema.json")
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "ClusterRole", "ClusterRoleBinding",
                  "CustomResourceDefinition", "StorageClass", "PriorityClass"}
KUSTOMIZE_KEYS = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator",
                  "generatorOptions", "images"}
K8S_VERSION = kubernetes_validate.latest_version()
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# ---------------------------------------------------------------- kustomize subset

def _load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _set_images(node, images):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for c in value:
                    name = c.get("image", "").split(":")[0].split("@")[0]
                    if name in images:
                        img = images[name]
                        c["image"] = f"{img.get('newName', name)}:{img['newTag']}" if "newTag" in img \
                            else img.get("newName", name)
            else:
                _set_images(value, images)
    elif isinstance(node, list):
        for item in node:
            _set_images(item, images)


def render_kustomization(directory):
    """resources, configMapGenerator (files, no name hash), namespace and images: what we use.
    Anything else in kustomization.yaml fails the test rather than being silently ignored."""
    (kust,) = _load_docs(os.path.join(directory, "kustomization.yaml"))
    unknown = set(kust) - KUSTOMIZE_KEYS
    assert not unknown, f"kustomize features this test does not render: {unknown}"
    assert kust["kind"] == "Kustomization"
    assert (kust.get("generatorOptions") or {}).get("disableNameSuffixHash") is True, \
        "generated names are referenced by the MPIJob: keep disableNameSuffixHash"
    objs = []
    for res in kust["resources"]:
        objs += _load_docs(os.path.join(directory, res))
    for gen in kust.get("configMapGenerator", []):
        assert set(gen) <= {"name", "files"}, gen
        data = {}
        for f in gen["files"]:
            key, _, path = f.partition("=") if "=" in f else (os.path.basename(f), "", f)
            with open(os.path.join(directory, path), encoding="utf-8") as fh:
                data[key] = fh.read()
        objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    if kust.get("namespace"):
        for o in objs:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = kust["namespace"]
            elif o["kind"] == "Namespace":        # kustomize renames a Namespace it is given
                o["metadata"]["name"] = kust["namespace"]
    images = {i["name"]: i for i in kust.get("images", [])}
    for o in objs:
        _set_images(o, images)
    return objs


def _key(o):
    return (o["kind"], o["metadata"]["name"])


@pytest.fixture(scope="module")
def rendered():
    return render_kustomization(KDIR)


def by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


# ---------------------------------------------------------------- validation

class Invalid(Exception):
    """A manifest the API server (or its operator) would refuse; the message says where."""


def _validator():
    assert os.access(VALIDATOR, os.X_OK), f"{VALIDATOR} is missing: run ./scripts/install.sh (it builds tools/k8s-validate)"
    return VALIDATOR


def run_validator(*args, stdin=None):
    return subprocess.run([_validator(), *args], input=stdin, capture_output=True, text=True, timeout=60)


def _validate_prometheus_operator(obj):
    out = run_validator("-", stdin=json.dumps(obj))
    if out.returncode == 1:
        raise Invalid(out.stdout.strip())
    assert out.returncode == 0 and out.stdout.startswith("ok "), (out.returncode, out.stdout, out.stderr)


def _validate_mpijob(obj):
    with open(MPIJOB_SCHEMA, encoding="utf-8") as f:
        schema = json.load(f)
    try:
        jsonschema.Draft7Validator(schema).validate(obj)
    except jsonschema.ValidationError as e:
        raise Invalid(f"{'.'.join(map(str, e.absolute_path))}: {e.message}") from None
    # ObjectMeta and PodTemplateSpec are core types: a v1 PodTemplate carries both
    for role, replica in obj["spec"]["mpiReplicaSpecs"].items():
        _validate_builtin({"apiVersion": "v1", "kind": "PodTemplate", "metadata": obj["metadata"],
                           "template": replica["template"]}, f"spec.mpiReplicaSpecs.{role}.template")


def _validate_builtin(obj, where=""):
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError,
            kubernetes_validate.InvalidSchemaError) as e:
        raise Invalid(f"{where or obj['kind']}: {e}") from None


def validate(obj):
    """Raise Invalid if the API server (with the operators' APIs installed) would refuse obj."""
    name = obj["metadata"]["name"]
    if not (_DNS_SUBDOMAIN.match(name) and len(name) <= 253):
        raise Invalid(f"bad metadata.name {name!r}")
    group = obj["apiVersion"].rpartition("/")[0]
    if group == "monitoring.coreos.com":
        _validate_prometheus_operator(obj)
    elif group == "kubeflow.org":
        _validate_mpijob(obj)
    elif "." in group:
        raise Invalid(f"{obj['apiVersion']} {obj['kind']}: no API this test knows")
    else:
        _validate_builtin(obj)


# ---------------------------------------------------------------- the manifests

def test_kustomization_renders_what_deploy_needs(rendered):
    kinds = sorted(_key(o) for o in rendered)
    assert kinds == sorted([
        ("Namespace", "collbench"), ("PersistentVolumeClaim", "collbench-state"),
        ("Deployment", "collbench-exporter"), ("Service", "collbench-exporter"),
        ("MPIJob", "collbench-stress"), ("ServiceMonitor", "collbench"),
        ("PrometheusRule", "collbench"), ("ConfigMap", "collbench-config")])
    assert all(o["metadata"].get("namespace") == "collbench" for o in rendered if o["kind"] != "Namespace")


def test_kustomizes_own_rendering_agrees(rendered):
    """Our subset renders exactly what kustomize's library renders (k8s-validate -kustomize)."""
    out = run_validator("-kustomize", KDIR)
    assert out.returncode == 0, out.stderr
    theirs = {_key(o): o for o in yaml.safe_load_all(out.stdout) if o}
    ours = {_key(o): o for o in rendered}
    assert theirs == ours


def test_kustomize_comparison_sees_a_difference(tmp_path, rendered):
    """Where the subset and kustomize differ, the comparison above sees it: a kustomization whose
    namespace is changed renders differently from the `rendered` of the checked-in one."""
    copy_dir = tmp_path / "k"
    shutil.copytree(KDIR, copy_dir)
    kust = (copy_dir / "kustomization.yaml").read_text()
    (copy_dir / "kustomization.yaml").write_text(kust.replace("namespace: collbench", "namespace: other"))
    out = run_validator("-kustomize", str(copy_dir))
    assert out.returncode == 0, out.stderr
    theirs = {_key(o): o for o in yaml.safe_load_all(out.stdout) if o}
    assert theirs != {_key(o): o for o in rendered}
    assert theirs == {_key(o): o for o in render_kustomization(str(copy_dir))}
    bad = run_validator("-kustomize", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "missing" in bad.stderr


def test_every_manifest_validates_against_its_schema(rendered):
    for obj in rendered:
        validate(obj)
    # the Prometheus Operator files as written, too: a duplicate key is gone once parsed to a dict
    files = [os.path.join(KDIR, f) for f in ("servicemonitor.yaml", "prometheusrule.yaml")]
    out = run_validator(*files)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["ok ServiceMonitor collbench", "ok PrometheusRule collbench"]


def _set(obj, path, value):
    node = obj
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


_LAUNCHER = ("spec", "mpiReplicaSpecs", "Launcher", "template", "spec")
_WORKER = ("spec", "mpiReplicaSpecs", "Worker", "template", "spec")
_POD = ("spec", "template", "spec")

# (kind, path, value, fragment of the message): one unknown or mistyped field per kind and level.
BAD_FIELDS = [
    ("Namespace", ("metadata", "lables"), {"a": "b"}, "lables"),
    ("Namespace", ("metadata", "labels"), ["a"], "labels"),
    ("PersistentVolumeClaim", ("spec", "accessMode"), ["ReadWriteMany"], "accessMode"),
    ("PersistentVolumeClaim", ("spec", "accessModes"), "ReadWriteMany", "accessModes"),
    ("Deployment", _POD + ("containers", 0, "port"), 9105, "port"),                        # should be ports
    ("Deployment", ("spec", "replicas"), "1", "replicas"),
    ("Service", ("spec", "ports", 0, "port"), "9105", "port"),
    ("Service", ("spec", "selectr"), {}, "selectr"),
    ("ConfigMap", ("dataa",), {}, "dataa"),
    ("ConfigMap", ("data", "collbench.yaml"), 1, "collbench.yaml"),
    ("MPIJob", ("spec", "slotsPerWorkr"), 1, "slotsPerWorkr"),                               # a typo
    ("MPIJob", ("spec", "slotsPerWorker"), "1", "slotsPerWorker"),
    ("MPIJob", ("spec", "mpiImplementation"), "OpenMPI5", "OpenMPI5"),                       # not in the enum
    ("MPIJob", ("spec", "runPolicy", "cleanPodPolicy"), "Sometimes", "Sometimes"),
    ("MPIJob", ("spec", "runPolicy", "backoffLimit"), 2 ** 31, "backoffLimit"),             # beyond int32
    ("MPIJob", ("spec", "mpiReplicaSpecs", "Launcher", "replicas"), 2, "replicas"),         # one launcher
    ("MPIJob", ("spec", "mpiReplicaSpecs", "Launchr"), {}, "Launchr"),
    ("MPIJob", ("spec", "mpiReplicaSpecs", "Worker", "restartPolicy"), "Always", "Always"),
    ("MPIJob", ("metadata", "labelz"), {}, "labelz"),
    ("MPIJob", _LAUNCHER + ("containers", 0, "comand"), ["x"], "comand"),
    ("MPIJob", _LAUNCHER + ("terminationGracePeriodSeconds",), "30", "terminationGracePeriodSeconds"),
    ("MPIJob", _WORKER + ("containers", 0, "securityContext", "capabilities", "add"), "IPC_LOCK", "add"),
    ("MPIJob", _WORKER + ("volume",), [], "volume"),
    ("ServiceMonitor", ("spec", "endpoints", 0, "interval"), "15 seconds", "interval"),      # not a duration
    ("ServiceMonitor", ("spec", "endpoints", 0, "scrapeTimout"), "10s", "scrapeTimout"),
    ("ServiceMonitor", ("spec", "endpoints", 0, "port"), 9105, "port"),
    ("ServiceMonitor", ("spec", "selector", "matchLabel"), {}, "matchLabel"),
    ("ServiceMonitor", ("metadata", "label"), {}, "label"),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "for"), "2 min", "for"),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "labels"), ["severity"], "labels"),
    ("PrometheusRule", ("spec", "groups", 0, "rulez"), [], "rulez"),
    ("PrometheusRule", ("spek",), {}, "spek"),
]


@pytest.mark.parametrize("kind,path,value,fragment", BAD_FIELDS,
                         ids=[f"{k}-{'.'.join(map(str, p))}" for k, p, _, _ in BAD_FIELDS])
def test_validation_rejects_an_unknown_or_mistyped_field(rendered, kind, path, value, fragment):
    obj = copy.deepcopy(by_kind(rendered, kind)[0])
    validate(copy.deepcopy(obj))            # valid as rendered: the change below is what fails
    _set(obj, path, value)
    with pytest.raises(Invalid) as e:
        validate(obj)
    assert fragment in str(e.value)


def test_every_kind_has_bad_field_rows(rendered):
    """A kind added to deploy/kubernetes gets its negative rows above."""
    assert {o["kind"] for o in rendered} <= {k for k, _, _, _ in BAD_FIELDS}


def test_validator_refuses_what_it_cannot_check():
    for doc, fragment in (('{"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitr", '
                           '"metadata": {"name": "a"}}', "ServiceMonitr"),
                          ('{"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", '
                           '"metadata": {"name": "a"}, "spec": {}, "spec": {}}', 'key "spec" already set'),
                          ("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {}\n", "name")):
        out = run_validator("-", stdin=doc)
        assert out.returncode == 1 and fragment in out.stdout, (doc, out.stdout, out.stderr)
    with pytest.raises(Invalid, match="no API"):
        validate({"apiVersion": "example.com/v1", "kind": "X", "metadata": {"name": "a"}})
    with pytest.raises(Invalid, match="kubeflow.org/v2beta1"):
        validate({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "a"}, "spec": {}})


def test_the_pieces_reference_each_other(rendered):
    dep = by_kind(rendered, "Deployment")[0]
    svc = by_kind(rendered, "Service")[0]
    mon = by_kind(rendered, "ServiceMonitor")[0]
    job = by_kind(rendered, "MPIJob")[0]
    cm = by_kind(rendered, "ConfigMap")[0]
    pvc = by_kind(rendered, "PersistentVolumeClaim")[0]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    svc_ports = {p["name"] for p in svc["spec"]["ports"]}
    assert {e["port"] for e in mon["spec"]["endpoints"]} <= svc_ports
    container_ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= container_ports
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    volumes = {v["name"]: v for v in launcher["volumes"]}
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    dep_vols = dep["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"] for v in dep_vols)
    images = {c["image"] for o in (dep, job) for c in _containers(o)}
    assert images == {"collbench:0.1.0"}


def _containers(obj):
    out = []
    stack = [obj]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            for k, v in n.items():
                if k == "containers":
                    out += v
                else:
                    stack.append(v)
        elif isinstance(n, list):
            stack += n
    return out


def test_the_commands_in_the_manifests_are_collbench_commands(rendered, tmp_path):
    """The exporter's flags and the launcher's verb parse with collbench's own parser, and the
    ConfigMap's config loads (with a stand-in for the hostfile the MPI Operator writes)."""
    from collbench.cli import build_parser
    from collbench.config import build_config
    dep = by_kind(rendered, "Deployment")[0]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][0] == "collbench"
    args = build_parser(c["command"][1:] + c["args"]).parse_args(c["command"][1:] + c["args"])
    assert args.listen == "0.0.0.0:9105" and args.results_log == "/var/lib/collbench/results.jsonl"
    job = by_kind(rendered, "MPIJob")[0]
    cmd = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    args = build_parser(cmd[1:]).parse_args(cmd[1:])
    assert (args.command, args.verb, args.config, args.state_dir) == \
        ("stress", "run", "/etc/collbench/collbench.yaml", "/var/lib/collbench")
    data = yaml.safe_load(by_kind(rendered, "ConfigMap")[0]["data"]["collbench.yaml"])
    assert data["hosts"] == "/etc/mpi/hostfile"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("collbench-stress-worker-0.collbench-stress.collbench.svc slots=1\n"
                        "collbench-stress-worker-1.collbench-stress.collbench.svc slots=1\n")
    cfg = build_config(dict(data, hosts=str(hostfile)), "collbench.yaml", str(tmp_path))
    assert cfg.ranks == job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] * job["spec"]["slotsPerWorker"]
    assert cfg.state_dir == "/var/lib/collbench"


def test_dockerfile_copies_what_exists_and_runs_collbench():
    with open(os.path.join(REPO, "Dockerfile"), encoding="utf-8") as f:
        text = f.read()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert lines[0].startswith("FROM ")
    copies = [ln.split()[1:-1] for ln in lines if ln.startswith("COPY ")]
    assert copies
    for sources in copies:
        for src in sources:
            assert os.path.exists(os.path.join(REPO, src)), f"Dockerfile copies {src}, which does not exist"
    assert "collbench engine build" in text and "/opt/collbench/bin/collbench-engine" in text
    cfg = yaml.safe_load(open(os.path.join(KDIR, "collbench.yaml"), encoding="utf-8"))
    assert cfg["engine_path"] == "/opt/collbench/bin/collbench-engine"


# ---------------------------------------------------------------- collbench rules --format prometheusrule

def _rules(*args, config=None):
    argv = [sys.executable, "-m", "collbench", "rules", "--format", "prometheusrule", *args]
    if config:
        argv += ["--config", config]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    return out


def test_rules_prometheusrule_output_validates():
    out = _rules("--namespace", "monitoring", "--label", "release=prometheus")
    assert out.returncode == 0, out.stderr
    (obj,) = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["labels"]["release"]) == \
        ("PrometheusRule", "monitoring", "prometheus")
    validate(obj)
    plain = subprocess.run([sys.executable, "-m", "collbench", "rules"], capture_output=True, text=True,
                           timeout=60, cwd=REPO)
    assert obj["spec"]["groups"] == yaml.safe_load(plain.stdout)["groups"]


def test_rules_prometheusrule_from_a_config_with_overrides_validates(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("thresholds:\n  latency:\n    allreduce:\n      256KB: {warning: 3ms, critical: 6ms}\n"
                   "alerts:\n  for: 90s\n  failure_window: 1h\n")
    out = _rules("--nodes", "16", "--link-gbps", "100", config=str(cfg))
    assert out.returncode == 0, out.stderr
    (obj,) = [d for d in yaml.safe_load_all(out.stdout) if d]
    validate(obj)
    exprs = [r["expr"] for g in obj["spec"]["groups"] for r in g["rules"]]
    assert any('size="256KB"' in e for e in exprs)


def test_rules_prometheusrule_bad_metadata_is_exit_2():
    for args in (["--name", "Collbench_Rules"], ["--namespace", "a.b"], ["--label", "no-equals"],
                 ["--label", "k=bad value"]):
        out = _rules(*args)
        assert out.returncode == 2 and "expected" in out.stderr and not out.stdout, (args, out.stderr)


def test_deploy_prometheusrule_is_the_generated_one():
    out = _rules()
    assert out.returncode == 0, out.stderr
    with open(os.path.join(KDIR, "prometheusrule.yaml"), encoding="utf-8") as f:
        assert f.read() == out.stdout, ("deploy/kubernetes/prometheusrule.yaml is stale: regenerate with "
                                        "collbench rules --format prometheusrule -o deploy/kubernetes/prometheusrule.yaml")
