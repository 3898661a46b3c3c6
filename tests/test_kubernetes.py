"""deploy/kubernetes/ and `collbench rules --format prometheusrule`, validated against the real
schemas: the Kubernetes API's (kubernetes-validate) for built-in kinds, and the published CRDs of
the MPI Operator and the Prometheus Operator (in ../shared/k8s-crds/, read there, never copied)
for the custom resources. The kustomization is rendered by the small kustomize subset below (what
deploy/kubernetes uses); where kubectl is installed its own `kubectl kustomize` must agree."""

import copy
import functools
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


def _crd_dir():
    """The project's shared CRD schemas: $COLLBENCH_SHARED_DIR/k8s-crds, else shared/k8s-crds
    beside the checkout or beside one of its parents (a clone may sit deeper than the main one)."""
    if os.environ.get("COLLBENCH_SHARED_DIR"):
        return os.path.join(os.environ["COLLBENCH_SHARED_DIR"], "k8s-crds")
    here = REPO
    while True:
        candidate = os.path.join(os.path.dirname(here), "shared", "k8s-crds")
        if os.path.isdir(candidate) or os.path.dirname(here) == here:
            return candidate
        here = os.path.dirname(here)


CRD_DIR = _crd_dir()
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


# ---------------------------------------------------------------- CRD schemas

def _strict(schema):
    """The CRD schema with unknown fields rejected (kubectl's default field validation is
    Strict), except where the schema preserves them."""
    schema = copy.deepcopy(schema)

    def walk(s):
        if isinstance(s, dict):
            if s.get("type") == "object" and "properties" in s and "additionalProperties" not in s \
                    and not s.get("x-kubernetes-preserve-unknown-fields"):
                s["additionalProperties"] = False
            for v in s.values():
                walk(v)
        elif isinstance(s, list):
            for v in s:
                walk(v)
    walk(schema)
    return schema


@functools.lru_cache(maxsize=None)
def _crds():
    """Every CRD document in CRD_DIR (the MPIJob one is 670 KB of YAML: parsed once)."""
    assert os.path.isdir(CRD_DIR), (f"the CRD schemas are expected in {CRD_DIR} (set COLLBENCH_SHARED_DIR "
                                    "to the folder holding k8s-crds/)")
    docs = []
    for name in sorted(os.listdir(CRD_DIR)):
        if name.endswith(".yaml"):
            with open(os.path.join(CRD_DIR, name), encoding="utf-8") as f:
                docs += [d for d in yaml.load_all(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]
    return docs


@functools.lru_cache(maxsize=None)
def crd_schema(api_version, kind):
    group, _, version = api_version.partition("/")
    for crd in _crds():
        spec = crd.get("spec", {})
        if crd.get("kind") != "CustomResourceDefinition" or spec.get("group") != group \
                or spec.get("names", {}).get("kind") != kind:
            continue
        for v in spec["versions"]:
            if v["name"] == version and v.get("served"):
                return _strict(v["schema"]["openAPIV3Schema"])
    raise AssertionError(f"no CRD for {api_version} {kind} in {CRD_DIR}")


def validate(obj):
    """Raise if obj is not valid: kubernetes-validate for built-in kinds, the CRD otherwise."""
    name = obj["metadata"]["name"]
    assert _DNS_SUBDOMAIN.match(name) and len(name) <= 253, f"bad metadata.name {name!r}"
    if "." in obj["apiVersion"].split("/")[0] and "/" in obj["apiVersion"]:
        jsonschema.Draft7Validator(crd_schema(obj["apiVersion"], obj["kind"])).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ---------------------------------------------------------------- the manifests

def test_kustomization_renders_what_deploy_needs(rendered):
    kinds = sorted(_key(o) for o in rendered)
    assert kinds == sorted([
        ("Namespace", "collbench"), ("PersistentVolumeClaim", "collbench-state"),
        ("Deployment", "collbench-exporter"), ("Service", "collbench-exporter"),
        ("MPIJob", "collbench-stress"), ("ServiceMonitor", "collbench"),
        ("PrometheusRule", "collbench"), ("ConfigMap", "collbench-config")])
    assert all(o["metadata"].get("namespace") == "collbench" for o in rendered if o["kind"] != "Namespace")


def test_kubectl_kustomize_agrees_where_installed(rendered):
    """Our subset renders exactly what kustomize itself does (when kubectl is on this machine)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:   # the subset above is the renderer then; its own test still ran
        assert render_kustomization(KDIR) == rendered
        return
    out = subprocess.run([kubectl, "kustomize", KDIR], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    theirs = {_key(o): o for o in yaml.safe_load_all(out.stdout) if o}
    ours = {_key(o): o for o in rendered}
    assert theirs == ours


def test_every_manifest_validates_against_its_schema(rendered):
    for obj in rendered:
        validate(obj)


def test_builtin_validation_rejects_a_bad_field(rendered):
    dep = copy.deepcopy(by_kind(rendered, "Deployment")[0])
    dep["spec"]["template"]["spec"]["containers"][0]["port"] = 9105   # should be ports
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(dep)


@pytest.mark.parametrize("kind,path,value", [
    ("MPIJob", ("spec", "slotsPerWorkr"), 1),                                # a typo
    ("MPIJob", ("spec", "mpiImplementation"), "OpenMPI5"),                   # not in the enum
    ("ServiceMonitor", ("spec", "endpoints", 0, "interval"), "15 seconds"),  # not a duration
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "for"), "2 min"),
])
def test_crd_validation_rejects_bad_custom_resources(rendered, kind, path, value):
    obj = copy.deepcopy(by_kind(rendered, kind)[0])
    node = obj
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate(obj)


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
