#!/usr/bin/env python3
"""Static checks of deploy/, the alert rules, runbooks, dashboard and Dockerfile.

Run by `cargo xtask test` (step "deploy checks"); run alone from anywhere with
`python3 deploy/tests/check.py`. Needs python3 with PyYAML, kubernetes-validate and
yamllint (`pip install kubernetes-validate yamllint`), and promtool (Debian's
`prometheus`). Each check prints one line; the last line is `N passed, N failed`, and the
exit status is non-zero when any check failed.

Kustomize: Debian 12 packages neither kubectl nor kustomize, so the manifests are
rendered by `render()` below, which implements the subset of kustomize these
kustomizations use (resources, components, namespace, and inline JSON 6902 `patches`
aimed at a kind and name) and refuses anything else. When
`kubectl` is on PATH its `kubectl kustomize` output is rendered too, must equal ours, and
is the one validated. The rendered objects are validated against the Kubernetes OpenAPI
schemas bundled in kubernetes-validate (strict: unknown fields fail), for the oldest and
the newest Kubernetes it bundles; the two prometheus-operator kinds, which it has no
schema for, against the local schemas in deploy/tests/schemas/.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPONENT = DEPLOY / "components" / "prometheus-operator"
CRIO_COMPONENT = DEPLOY / "components" / "cri-o"
WEB_CONFIG_COMPONENT = DEPLOY / "components" / "web-config"
CLUSTER_VIEW_COMPONENT = DEPLOY / "components" / "cluster-view"
KERNEL_510_COMPONENT = DEPLOY / "components" / "kernel-5.10"
RULES = DEPLOY / "prometheus" / "rules.yaml"
RULES_TEST = DEPLOY / "prometheus" / "rules.test.yaml"
PROMETHEUS_RULE = COMPONENT / "prometheusrule.yaml"
DASHBOARD = DEPLOY / "grafana" / "node-diag.json"
RUNBOOKS = ROOT / "docs" / "runbooks"
SCHEMAS = DEPLOY / "tests" / "schemas"
DOCKERFILE = ROOT / "Dockerfile"
METRICS_DOC = ROOT / "docs" / "metrics.md"
RUNBOOK_BASE = "https://github.com/node-diag/node-diag/blob/main/docs/runbooks/"

# The alerts the deploy issue requires; rules.yaml may have more.
REQUIRED_ALERTS = {
    "NodeDiagOverlayMTUMismatch",
    "NodeDiagPMTUDBlackhole",
    "NodeDiagDFOversizeDrops",
    "NodeDiagTCPConnectTimeouts",
    "NodeDiagEventsLost",
    "NodeDiagAgentDown",
}
# The host paths the agent reads, and nothing else (each justified in daemonset.yaml).
HOST_MOUNTS = {"/sys/kernel/tracing", "/sys/kernel/btf", "/run/netns", "/var/run/netns"}
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
CRIO_SOCKET = "/var/run/crio/crio.sock"
# The capabilities the DaemonSet grants, each justified in daemonset.yaml.
CAPABILITIES = {"BPF", "PERFMON", "NET_ADMIN", "NET_RAW", "SYS_ADMIN"}
# Kinds that have no namespace (the subset kustomize's namespace transformer skips).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "StorageClass",
    "PersistentVolume",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")

try:
    import yaml
except ImportError:  # pragma: no cover - reported as a clear failure
    print("[deploy] python3 module yaml (PyYAML) missing: pip install kubernetes-validate yamllint")
    sys.exit(2)


class CheckError(Exception):
    """A check failed; the message says what and where."""


# --------------------------------------------------------------------------------------
# A kustomize subset: resources, components, namespace, inline JSON 6902 patches.


def _kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise CheckError(f"{directory}: no kustomization file")


def _load_docs(path: Path) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "metadata" not in d:
            raise CheckError(f"{path}: not a Kubernetes object: {d!r:.80}")
    return docs


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise CheckError(f"JSON pointer {path!r} must start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _step(node, token: str, where: str):
    if isinstance(node, list):
        try:
            return node[int(token)]
        except (ValueError, IndexError) as e:
            raise CheckError(f"{where}: no index {token}") from e
    if isinstance(node, dict) and token in node:
        return node[token]
    raise CheckError(f"{where}: no {token!r}")


def apply_json6902(obj: dict, ops: list[dict], where: str) -> None:
    """RFC 6902 add, replace, remove and test, as kustomize applies them."""
    for op in ops:
        kind, tokens = op.get("op"), _pointer(op.get("path", ""))
        parent = obj
        for t in tokens[:-1]:
            parent = _step(parent, t, f"{where}: {op['path']}")
        last = tokens[-1]
        if kind == "test":
            if _step(parent, last, f"{where}: {op['path']}") != op.get("value"):
                raise CheckError(f"{where}: test {op['path']} == {op.get('value')!r} failed")
        elif kind == "add":
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                parent.insert(index, copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            _step(parent, last, f"{where}: {op['path']}")
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            _step(parent, last, f"{where}: {op['path']}")
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise CheckError(f"{where}: JSON patch op {kind!r} is beyond the test renderer")


def apply_patches(kfile: Path, patches: list[dict], objects: list[dict]) -> None:
    for i, entry in enumerate(patches):
        if set(entry) != {"target", "patch"} or not set(entry["target"]) <= {"kind", "name"}:
            raise CheckError(
                f"{kfile}: patch {i}: only inline `patch` with a `target` of kind and name "
                "is supported by the test renderer"
            )
        ops = yaml.safe_load(entry["patch"])
        if not isinstance(ops, list):
            raise CheckError(f"{kfile}: patch {i}: only JSON 6902 (a list of operations)")
        target = entry["target"]
        hits = [
            o
            for o in objects
            if o["kind"] == target.get("kind", o["kind"])
            and o["metadata"]["name"] == target.get("name", o["metadata"]["name"])
        ]
        if not hits:
            raise CheckError(f"{kfile}: patch {i} matches no object")
        for obj in hits:
            apply_json6902(obj, ops, f"{kfile}: patch {i}")


def render(
    directory: Path, *, expect_kind: str = "Kustomization", _seen=None, _base=None
) -> list[dict]:
    """The objects `kubectl kustomize directory` prints, for the supported subset. A
    component is rendered over `_base`, the objects of the kustomization using it, which
    its patches may change."""
    seen = set() if _seen is None else _seen
    directory = directory.resolve()
    if directory in seen:
        raise CheckError(f"{directory}: kustomization cycle")
    seen.add(directory)
    kfile = _kustomization_file(directory)
    k = yaml.safe_load(kfile.read_text()) or {}
    supported = {"apiVersion", "kind", "namespace", "resources", "components", "patches"}
    unsupported = set(k) - supported
    if unsupported:
        raise CheckError(
            f"{kfile}: fields {sorted(unsupported)} are beyond the test renderer "
            f"(it supports {sorted(supported)}); extend deploy/tests/check.py"
        )
    kind = k.get("kind", "Kustomization")
    if kind != expect_kind:
        raise CheckError(f"{kfile}: kind {kind}, expected {expect_kind}")
    objects: list[dict] = copy.deepcopy(_base) if _base is not None else []
    for entry in k.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects.extend(render(path, _seen=seen))
        elif path.is_file():
            objects.extend(_load_docs(path))
        else:
            raise CheckError(f"{kfile}: resource {entry} does not exist")
    for entry in k.get("components", []):
        path = (directory / entry).resolve()
        if not path.is_dir():
            raise CheckError(f"{kfile}: component {entry} is not a directory")
        objects = render(path, expect_kind="Component", _seen=seen, _base=objects)
    apply_patches(kfile, k.get("patches", []), objects)
    namespace = k.get("namespace")
    if namespace:
        for obj in objects:
            kind = obj["kind"]
            if kind in ("RoleBinding", "ClusterRoleBinding"):
                raise CheckError(f"{kfile}: {kind} subjects are beyond the test renderer")
            if kind == "Namespace":
                if obj["metadata"]["name"] != namespace:
                    raise CheckError(
                        f"{kfile}: Namespace {obj['metadata']['name']} under namespace: "
                        f"{namespace} is beyond the test renderer"
                    )
            elif kind not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
    ids = [object_id(o) for o in objects]
    dups = {i for i in ids if ids.count(i) > 1}
    if dups:
        raise CheckError(f"{kfile}: duplicate objects {sorted(dups)}")
    seen.discard(directory)
    return objects


def object_id(obj: dict) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def overlay_with_component(tmp: Path, component: Path = COMPONENT, *more: Path) -> Path:
    """A user's overlay (outside deploy/: kustomize refuses one inside its base): the base
    plus `component` (the prometheus-operator one by default) and `more`, in order."""
    components = (component, *more)
    overlay = tmp / f"overlay-{'-'.join(c.name for c in components)}"
    overlay.mkdir()
    base = os.path.relpath(DEPLOY, overlay)
    listed = "".join(f"  - {os.path.relpath(c, overlay)}\n" for c in components)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n  - {base}\n"
        f"components:\n{listed}"
    )
    return overlay


def kubectl_kustomize(directory: Path) -> list[dict] | None:
    """`kubectl kustomize directory`, or None when kubectl is not installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise CheckError(f"kubectl kustomize {directory} failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


# --------------------------------------------------------------------------------------
# Checks.

RESULTS: list[tuple[str, bool]] = []


def check(name: str):
    def wrap(fn):
        def run(*args, **kwargs):
            try:
                detail = fn(*args, **kwargs)
            except CheckError as e:
                print(f"[deploy] {name}: FAILED: {e}")
                RESULTS.append((name, False))
                return None
            except Exception:  # a bug in a check is a failure too, with its trace
                print(f"[deploy] {name}: FAILED:\n{traceback.format_exc()}")
                RESULTS.append((name, False))
                return None
            print(f"[deploy] {name}: ok{f' ({detail})' if detail else ''}")
            RESULTS.append((name, True))
            return True

        return run

    return wrap


def _run(argv: list[str], what: str) -> str:
    if shutil.which(argv[0]) is None:
        raise CheckError(f"{argv[0]} not found: {what}")
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise CheckError(f"`{' '.join(argv)}` failed:\n{out.stdout}{out.stderr}")
    return out.stdout + out.stderr


RENDERED: dict[str, list[dict]] = {}


@check("kustomize render (deploy/, and with each of components/)")
def check_render(tmp: Path):
    notes = []
    for name, directory in (
        ("base", DEPLOY),
        ("with-operator", overlay_with_component(tmp)),
        ("with-cri-o", overlay_with_component(tmp, CRIO_COMPONENT)),
        ("with-kernel-5.10", overlay_with_component(tmp, KERNEL_510_COMPONENT)),
        ("with-web-config", overlay_with_component(tmp, WEB_CONFIG_COMPONENT)),
        (
            "with-cluster-view",
            overlay_with_component(tmp, WEB_CONFIG_COMPONENT, CLUSTER_VIEW_COMPONENT),
        ),
    ):
        ours = render(directory)
        theirs = kubectl_kustomize(directory)
        if theirs is None:
            RENDERED[name] = ours
            continue
        a = {object_id(o): o for o in ours}
        b = {object_id(o): o for o in theirs}
        if a != b:
            only = set(a) ^ set(b)
            differing = [i for i in set(a) & set(b) if a[i] != b[i]]
            raise CheckError(
                f"{name}: test renderer and kubectl kustomize disagree: objects only in "
                f"one {sorted(only)}, differing {sorted(differing)}"
            )
        RENDERED[name] = theirs
        notes.append(name)
    if notes:
        return "kubectl kustomize output, identical to the test renderer's"
    return "test renderer (kubectl not installed)"


@check("Kubernetes schemas (kubernetes-validate --strict, oldest and newest bundled)")
def check_schemas():
    try:
        import kubernetes_validate
        from kubernetes_validate.utils import latest_version
    except ImportError as e:
        raise CheckError(f"{e}: pip install kubernetes-validate") from e
    versions = _bundled_versions(kubernetes_validate)
    versions = sorted({versions[0], latest_version()}, key=_version_key)
    objects = RENDERED.get("with-operator")
    if not objects:
        raise CheckError("nothing rendered")
    # The other components change the DaemonSet and the Service only.
    for variant in ("with-cri-o", "with-kernel-5.10", "with-web-config", "with-cluster-view"):
        objects = objects + [
            o for o in RENDERED.get(variant, []) if o["kind"] in ("DaemonSet", "Service")
        ]
    validated = 0
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
            except kubernetes_validate.ValidationError as e:
                raise CheckError(
                    f"{obj['kind']}/{obj['metadata']['name']} against {version}: "
                    f"{'.'.join(map(str, e.path))}: {e.message}"
                ) from e
            validated += 1
    return f"{validated} validations, Kubernetes {' and '.join(versions)}"


def _version_key(v: str):
    return tuple(int(x) for x in v.split("."))


def _bundled_versions(module) -> list[str]:
    schema_dir = Path(module.__file__).parent / "kubernetes-json-schema"
    versions = set()
    for d in schema_dir.iterdir():
        m = re.fullmatch(r"v(\d+\.\d+\.\d+)-local-strict", d.name)
        if m:
            versions.add(m.group(1))
    if not versions:
        raise CheckError(f"no bundled schemas under {schema_dir}")
    return sorted(versions, key=_version_key)


@check("prometheus-operator objects (local schemas in deploy/tests/schemas/)")
def check_crd_schemas():
    try:
        import jsonschema
    except ImportError as e:
        raise CheckError(f"{e}: pip install kubernetes-validate (brings jsonschema)") from e
    objects = [
        o for o in RENDERED.get("with-operator", []) if o["apiVersion"].startswith("monitoring.coreos.com/")
    ]
    kinds = sorted(o["kind"] for o in objects)
    if kinds != ["PrometheusRule", "ServiceMonitor"]:
        raise CheckError(f"expected a PrometheusRule and a ServiceMonitor, got {kinds}")
    for obj in objects:
        schema = json.loads((SCHEMAS / f"{obj['kind'].lower()}.json").read_text())
        try:
            jsonschema.validate(obj, schema)
        except jsonschema.ValidationError as e:
            raise CheckError(
                f"{obj['kind']}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
            ) from e
    return ", ".join(kinds)


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


def check_probes(container: dict) -> None:
    """The probes GET /readyz and /healthz over plain HTTP on the findings listener's
    loopback port: whatever TLS or authentication the scrape port requires (a client
    certificate the kubelet cannot present, a password it does not have), they work, and
    nothing off the node can use up that listener's connections."""
    args = container["args"]
    findings = args[args.index("--findings-listen") + 1]
    findings_port = int(findings.rsplit(":", 1)[1])
    if "--findings-web-config-file" in args:
        raise CheckError("--findings-web-config-file would take plain HTTP from the probes")
    for probe, path in (
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
    ):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") != findings_port:
            raise CheckError(f"{probe} must GET {path} on the findings port {findings_port}: {get}")
        if get.get("host") != "127.0.0.1":
            raise CheckError(f"{probe} must use loopback (host: 127.0.0.1): {get}")
        if get.get("scheme", "HTTP") != "HTTP":
            raise CheckError(f"{probe} must use plain HTTP (the findings listener's): {get}")


@check("DaemonSet contract (security context, mounts, probes, resources, placement)")
def check_daemonset():
    objs = {(o["kind"], o["metadata"]["name"]): o for o in RENDERED.get("base", [])}
    ns = objs.get(("Namespace", "node-diag"))
    ds = objs.get(("DaemonSet", "node-diag"))
    svc = objs.get(("Service", "node-diag"))
    if not (ns and ds and svc and ("ServiceAccount", "node-diag") in objs):
        raise CheckError(f"expected Namespace, ServiceAccount, DaemonSet, Service; got {sorted(objs)}")
    labels = ns["metadata"].get("labels", {})
    if labels.get("pod-security.kubernetes.io/enforce") != "privileged":
        raise CheckError("namespace lacks pod-security.kubernetes.io/enforce: privileged")
    pod = ds["spec"]["template"]["spec"]
    if not pod.get("hostNetwork"):
        raise CheckError("hostNetwork must be true: the agent reports for the node's namespace")
    if pod.get("automountServiceAccountToken") is not False:
        raise CheckError("the agent needs no API token: automountServiceAccountToken: false")
    (container,) = pod["containers"]
    sc = container["securityContext"]
    for key, want in (
        ("privileged", False),
        ("allowPrivilegeEscalation", False),
        ("readOnlyRootFilesystem", True),
    ):
        if sc.get(key) is not want:
            raise CheckError(f"securityContext.{key} must be {want}")
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"] or set(caps.get("add", [])) != CAPABILITIES:
        raise CheckError(f"capabilities must drop ALL and add {sorted(CAPABILITIES)}: {caps}")
    # Arguments: --listen on all addresses, port = containerPort = the Service's target.
    args = container["args"]
    if args[0] != "run" or "--listen" not in args:
        raise CheckError(f"args must be `run --listen ADDR ...`: {args}")
    listen = args[args.index("--listen") + 1]
    port = int(listen.rsplit(":", 1)[1])
    # /findings (flow data) stays on the node's loopback.
    if "--findings-listen" not in args:
        raise CheckError(f"args lack --findings-listen (loopback): {args}")
    findings = args[args.index("--findings-listen") + 1]
    if not findings.startswith(("127.0.0.1:", "[::1]:")):
        raise CheckError(f"--findings-listen must be a loopback address, is {findings}")
    env = {e["name"]: e for e in container.get("env", [])}
    if env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
        raise CheckError("env NODE_NAME must come from the downward API's spec.nodeName")
    if pod.get("priorityClassName") != "system-node-critical":
        raise CheckError("priorityClassName must be system-node-critical")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if ports.get("metrics") != port:
        raise CheckError(f"containerPort metrics {ports.get('metrics')} != --listen port {port}")
    (sport,) = svc["spec"]["ports"]
    if sport["targetPort"] != "metrics" or sport["name"] != "metrics":
        raise CheckError(f"Service port must target the container port named metrics: {sport}")
    if not svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items():
        raise CheckError("Service selector does not match the DaemonSet's pods")
    check_probes(container)
    res = container.get("resources", {})
    for section, keys in (("requests", ("cpu", "memory")), ("limits", ("memory",))):
        for key in keys:
            value = str(res.get(section, {}).get(key, ""))
            if not QUANTITY.match(value):
                raise CheckError(f"resources.{section}.{key} is not a quantity: {value!r}")
    # Host mounts the agent needs, and no other.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    if host_paths != HOST_MOUNTS | {CONTAINERD_SOCKET}:
        raise CheckError(
            f"host mounts must be exactly {sorted(HOST_MOUNTS | {CONTAINERD_SOCKET})}: "
            f"{sorted(host_paths)}"
        )
    for path in sorted(HOST_MOUNTS):
        m = mounts.get(path)
        if m is None:
            raise CheckError(f"no volumeMount at {path}")
        host = volumes[m["name"]].get("hostPath", {}).get("path")
        if host != path:
            raise CheckError(f"{path} must be the host's {path} (hostPath), got {host}")
    for path in ("/run/netns", "/var/run/netns", "/sys/kernel/tracing"):
        if mounts[path].get("mountPropagation") != "HostToContainer":
            raise CheckError(f"{path} needs mountPropagation: HostToContainer (new mounts)")
    check_cri_socket(pod, CONTAINERD_SOCKET)
    if not pod.get("hostPID"):
        raise CheckError("hostPID must be true: the agent reads /proc/<pid>/ns/net")
    # Placement: Linux amd64 and arm64, control-plane nodes too.
    if pod.get("nodeSelector", {}).get("kubernetes.io/os") != "linux":
        raise CheckError("nodeSelector kubernetes.io/os: linux")
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    archs = {
        v
        for t in terms
        for e in t["matchExpressions"]
        if e["key"] == "kubernetes.io/arch"
        for v in e["values"]
    }
    if archs != {"amd64", "arm64"}:
        raise CheckError(f"node affinity must allow amd64 and arm64, got {sorted(archs)}")
    if {"operator": "Exists"} not in pod.get("tolerations", []):
        raise CheckError("tolerations must include `- operator: Exists` (every taint)")
    return f"caps {'+'.join(sorted(CAPABILITIES))}, listen {listen}, findings {findings}"


def check_cri_socket(pod: dict, path: str) -> None:
    """The runtime's CRI socket mounted read-only where the agent looks, `type: Socket`."""
    (container,) = pod["containers"]
    m = {m["mountPath"]: m for m in container["volumeMounts"]}.get(path)
    if m is None or not m.get("readOnly"):
        raise CheckError(f"no read-only volumeMount of the CRI socket {path}")
    hp = {v["name"]: v for v in pod["volumes"]}[m["name"]].get("hostPath", {})
    if hp.get("path") != path or hp.get("type") != "Socket":
        raise CheckError(f"{path} must be the host's {path} with hostPath type Socket: {hp}")


def _daemonset(variant: str) -> dict:
    for o in RENDERED.get(variant, []):
        if o["kind"] == "DaemonSet":
            return o["spec"]["template"]["spec"]
    raise CheckError(f"{variant}: no DaemonSet rendered")


@check("components/cri-o: CRI-O's socket instead of containerd's")
def check_crio_component():
    pod = _daemonset("with-cri-o")
    check_cri_socket(pod, CRIO_SOCKET)
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    if CONTAINERD_SOCKET in host_paths:
        raise CheckError("containerd's socket still mounted")


@check("components/kernel-5.10: SYS_RESOURCE added, nothing else")
def check_kernel_510_component():
    pod = _daemonset("with-kernel-5.10")
    (container,) = pod["containers"]
    caps = container["securityContext"]["capabilities"]
    want = CAPABILITIES | {"SYS_RESOURCE"}
    if caps.get("drop") != ["ALL"] or sorted(caps.get("add", [])) != sorted(want):
        raise CheckError(f"capabilities must drop ALL and add {sorted(want)}: {caps}")
    base = _daemonset("base")
    (base_container,) = base["containers"]
    if {k: v for k, v in container.items() if k != "securityContext"} != {
        k: v for k, v in base_container.items() if k != "securityContext"
    }:
        raise CheckError("the component changes more than the capabilities")


@check("components/web-config: --web-config-file from the Secret, probes unchanged")
def check_web_config_component():
    pod = _daemonset("with-web-config")
    (container,) = pod["containers"]
    args = container["args"]
    if "--web-config-file" not in args:
        raise CheckError(f"args lack --web-config-file: {args}")
    path = Path(args[args.index("--web-config-file") + 1])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    holders = [
        n for n, m in mounts.items() if path.parent == Path(m["mountPath"]) and "secret" in volumes[n]
    ]
    if not holders:
        raise CheckError(f"{path} is not in a Secret volume's mount")
    if "subPath" in mounts[holders[0]]:
        raise CheckError("no subPath: a Secret mounted by subPath is never updated")
    # The scrape port may now require a client certificate: the probes must not use it.
    check_probes(container)
    return f"{path} from Secret {volumes[holders[0]]['secret']['secretName']}"


@check("components/cluster-view: /findings on the TLS scrape port, SRV port `findings`")
def check_cluster_view_component():
    objs = {(o["kind"], o["metadata"]["name"]): o for o in RENDERED.get("with-cluster-view", [])}
    svc = objs.get(("Service", "node-diag"))
    if svc is None:
        raise CheckError("no Service node-diag rendered")
    if svc["spec"].get("clusterIP") != "None":
        raise CheckError("the Service must stay headless: one A/AAAA record per agent")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    # `node-diag findings --cluster` reads the port from _findings._tcp.<service>.
    findings = ports.get("findings")
    if findings is None or findings.get("protocol", "TCP") != "TCP":
        raise CheckError(f"no TCP Service port named findings: {svc['spec']['ports']}")
    pod = _daemonset("with-cluster-view")
    (container,) = pod["containers"]
    args = container["args"]
    listen_port = int(args[args.index("--listen") + 1].rsplit(":", 1)[1])
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    target = findings["targetPort"]
    target = named.get(target) if isinstance(target, str) else target
    if target != listen_port:
        raise CheckError(
            f"the findings port targets {findings['targetPort']} ({target}), not the scrape "
            f"listener's {listen_port}, where /findings is served under client-certificate TLS"
        )
    # The scrape listener serves /findings only under a web config verifying client
    # certificates: the web-config component's Secret must be there.
    if "--web-config-file" not in args:
        raise CheckError("no --web-config-file: use it with components/web-config")
    # The findings listener stays loopback, plain, for the probes.
    if not args[args.index("--findings-listen") + 1].startswith("127.0.0.1:"):
        raise CheckError("--findings-listen must stay on loopback")
    check_probes(container)
    text = (CLUSTER_VIEW_COMPONENT / "kustomization.yaml").read_text()
    if "RequireAndVerifyClientCert" not in text:
        raise CheckError("the component's example web config must verify client certificates")
    return f"Service port findings -> {listen_port}, probes on loopback"


@check("yamllint deploy/")
def check_yamllint():
    config = DEPLOY / "tests" / "yamllint.yaml"
    _run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(config), str(DEPLOY)],
        "pip install yamllint",
    )


@check("promtool check rules deploy/prometheus/rules.yaml")
def check_promtool_rules():
    out = _run(["promtool", "check", "rules", str(RULES)], "apt-get install prometheus")
    m = re.search(r"SUCCESS: (\d+) rules found", out)
    return f"{m.group(1)} rules" if m else None


@check("promtool test rules deploy/prometheus/rules.test.yaml")
def check_promtool_tests():
    _run(["promtool", "test", "rules", str(RULES_TEST)], "apt-get install prometheus")


def alerts_of(groups: list[dict]) -> list[dict]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


@check("every alert: required set, annotations, runbook, a firing and a silent unit test")
def check_alert_coverage():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = alerts_of(groups)
    names = [a["alert"] for a in alerts]
    missing = REQUIRED_ALERTS - set(names)
    if missing:
        raise CheckError(f"missing alerts {sorted(missing)}")
    if len(set(names)) != len(names):
        raise CheckError(f"duplicate alert names in {names}")
    for a in alerts:
        ann = a.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not ann.get(key):
                raise CheckError(f"{a['alert']}: no {key} annotation")
        for key in ("summary", "description"):
            if "$labels.node" not in ann[key]:
                raise CheckError(f"{a['alert']}: {key} does not name the node ($labels.node)")
        if ann["runbook_url"] != f"{RUNBOOK_BASE}{a['alert']}.md":
            raise CheckError(f"{a['alert']}: runbook_url must be {RUNBOOK_BASE}{a['alert']}.md")
        if not (RUNBOOKS / f"{a['alert']}.md").is_file():
            raise CheckError(f"{a['alert']}: no docs/runbooks/{a['alert']}.md")
        if a.get("labels", {}).get("severity") not in ("info", "warning", "critical"):
            raise CheckError(f"{a['alert']}: severity must be info, warning or critical")
    extra = {p.stem for p in RUNBOOKS.glob("*.md")} - set(names)
    if extra:
        raise CheckError(f"runbooks without an alert: {sorted(extra)}")
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    firing, silent = set(), set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    for name in names:
        if name not in firing or name not in silent:
            raise CheckError(f"{name}: needs a unit test where it fires and one where it is silent")
    return f"{len(names)} alerts"


@check("PrometheusRule spec.groups == deploy/prometheus/rules.yaml groups")
def check_rule_copies():
    plain = yaml.safe_load(RULES.read_text())["groups"]
    (rule,) = _load_docs(PROMETHEUS_RULE)
    if rule["spec"]["groups"] != plain:
        raise CheckError(
            "deploy/components/prometheus-operator/prometheusrule.yaml differs from "
            "deploy/prometheus/rules.yaml: copy the groups over"
        )


METRIC = re.compile(r"\bnode_diag_[a-z_]+\b")


def documented_metrics() -> set[str]:
    """Metric names in docs/metrics.md's table (`| \\`node_diag_...\\` | labels |`)."""
    names = set()
    for line in METRICS_DOC.read_text().splitlines():
        m = re.match(r"\|\s*`(node_diag_[a-z_]+)`\s*\|", line)
        if m:
            names.add(m.group(1))
    return names


@check("alert expressions use documented metrics only")
def check_rule_metrics():
    documented = documented_metrics()
    used = set()
    for a in alerts_of(yaml.safe_load(RULES.read_text())["groups"]):
        used |= set(METRIC.findall(a["expr"]))
    unknown = used - documented
    if unknown:
        raise CheckError(f"not in docs/metrics.md's metrics table: {sorted(unknown)}")
    return f"{len(used)} metrics"


@check("Grafana dashboard deploy/grafana/node-diag.json")
def check_dashboard(tmp: Path):
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        raise CheckError("needs a templating variable `datasource` of type datasource (prometheus)")
    panels = []

    def walk(ps):
        for p in ps:
            panels.append(p)
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    exprs = []
    for p in panels:
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            raise CheckError(f"panel {p.get('title')!r} must use the ${{datasource}} variable")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") not in (None, "${datasource}"):
                raise CheckError(f"panel {p.get('title')!r}: target datasource must be ${{datasource}}")
            exprs.append((p["title"], t["expr"]))
    if not exprs:
        raise CheckError("no queries")
    # Required views.
    joined = "\n".join(e for _, e in exprs)
    for metric, by in (
        ("node_diag_findings_total", "kind"),
        ("node_diag_findings_total", "layer"),
        ("node_diag_overlay_mtu_headroom_bytes", "interface"),
        ("node_diag_drops_total", "reason"),
        ("node_diag_tcp_connect_failures_total", "reason"),
    ):
        if not any(metric in e and by in e for _, e in exprs):
            raise CheckError(f"no panel shows {metric} by {by}")
    unknown = set(METRIC.findall(joined)) - documented_metrics()
    if unknown:
        raise CheckError(f"queries use metrics missing from docs/metrics.md's table: {sorted(unknown)}")
    # Every query parses: as recording rules, with the template variables substituted.
    subst = {
        "$__rate_interval": "5m",
        "$__interval": "1m",
        "$__range": "1h",
        "${node:regex}": ".*",
        "$node": ".*",
        "${job}": "node-diag",
        "$job": "node-diag",
    }
    rules = []
    for i, (title, e) in enumerate(exprs):
        for k, v in subst.items():
            e = e.replace(k, v)
        if "$" in e:
            raise CheckError(f"panel {title!r}: unknown template variable in {e}")
        rules.append({"record": f"dashboard:query_{i}", "expr": e})
    path = tmp / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    _run(["promtool", "check", "rules", str(path)], "apt-get install prometheus")
    return f"{len(panels)} panels, {len(exprs)} queries parse"


@check("Dockerfile: multi-stage, amd64 + arm64, LLVM 22 bpf-linker, runtime image")
def check_dockerfile():
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    if len(stages) < 2:
        raise CheckError(f"expected a multi-stage build, found {len(stages)} FROM")
    if "--platform=$BUILDPLATFORM" not in text:
        raise CheckError("the builder should run on $BUILDPLATFORM and cross-compile")
    for needle in (
        "aarch64-unknown-linux-gnu",
        "x86_64-unknown-linux-gnu",
        "gcc-aarch64-linux-gnu",
        "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
        "ARG LLVM_MAJOR=22",
        "llvm-${LLVM_MAJOR}-dev",
        "--features llvm-${LLVM_MAJOR}",
        "rust-src",
        "nd_set_state",
    ):
        if needle not in text:
            raise CheckError(f"Dockerfile lacks {needle!r}")
    final = stages[-1][0]
    if "distroless" not in final and "slim" not in final:
        raise CheckError(f"runtime stage should be distroless or slim, is {final}")
    if not re.search(r"^ENTRYPOINT\s+\[\"/usr/local/bin/node-diag\"", text, re.M):
        raise CheckError('ENTRYPOINT ["/usr/local/bin/node-diag", ...] missing')
    return f"{len(stages)} stages, runtime {final}"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="node-diag-deploy-") as tmp:
        tmp = Path(tmp)
        check_render(tmp)
        check_schemas()
        check_crd_schemas()
        check_daemonset()
        check_crio_component()
        check_kernel_510_component()
        check_web_config_component()
        check_cluster_view_component()
        check_yamllint()
        check_promtool_rules()
        check_promtool_tests()
        check_alert_coverage()
        check_rule_copies()
        check_rule_metrics()
        check_dashboard(tmp)
        check_dockerfile()
    passed = sum(ok for _, ok in RESULTS)
    failed = len(RESULTS) - passed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
