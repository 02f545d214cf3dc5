"""The cluster's own objects as one JSON List for `kubectl apply --server-side`: RBAC for each host-run part, the KubeRay and Kueue CRDs of the built parts, Kueue's webhooks by URL.

Usage: manifests.py KUBERAY_BIN KUEUE_BIN WEBHOOK_URL CA_FILE rbac|crds|webhooks [KWOK_BIN]
(KWOK_BIN, when kwok's part is built: its upstream ClusterRole, bound to kwok's own user e2e:kwok.)
Kueue's upstream kustomization points its webhooks (and five CRDs' conversion webhooks) at an
in-cluster Service; here Kueue runs on the host, so each clientConfig becomes a URL on 127.0.0.1 with
our CA. Only the webhooks Kueue serves with this configuration are registered (its own kinds, RayJob,
RayCluster): a registered webhook nobody serves would refuse every object of its kind.
"""

import base64
import json
import pathlib
import sys

import yaml

RAY_KINDS = {"rayjobs", "rayclusters"}


def load_all(path):
    return [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d]


def binding(name, role, user):
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def rbac(kuberay, kueue, kwok=None):
    objs = [
        # the API server's client certificate towards the kubelet (logs, exec, port-forward), as kubeadm does
        binding("e2e:apiserver-kubelet-client", "system:kubelet-api-admin", "kube-apiserver-kubelet-client"),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "e2e:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        binding("e2e:coredns", "e2e:coredns", "e2e:coredns"),
    ]
    for role in load_all(kuberay / "rbac" / "role.yaml"):  # ClusterRole kuberay-operator
        objs += [role, binding("e2e:kuberay-operator", role["metadata"]["name"], "e2e:kuberay-operator")]
    for role in load_all(kueue / "rbac" / "role.yaml"):  # ClusterRole manager-role (kueue- prefix upstream)
        role["metadata"]["name"] = "kueue-" + role["metadata"]["name"]
        objs += [role, binding("e2e:kueue", role["metadata"]["name"], "e2e:kueue")]
    for role in load_all(kwok / "rbac" / "role.yaml") if kwok else []:  # ClusterRole kwok-controller
        objs += [role, binding("e2e:kwok", role["metadata"]["name"], "e2e:kwok")]
    objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}})
    # Kueue watches the Secrets of its own namespace (upstream config/components/rbac/manager_secrets_role.yaml);
    # without this its informer never syncs and none of its controllers starts
    objs += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "kueue-manager-secrets-role", "namespace": "kueue-system"},
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "update", "watch"]}]},
        {**binding("e2e:kueue-secrets", "kueue-manager-secrets-role", "e2e:kueue"), "kind": "RoleBinding",
         "metadata": {"name": "e2e:kueue-secrets", "namespace": "kueue-system"}},
    ]
    objs[-1]["roleRef"]["kind"] = "Role"
    return objs


def crds(kuberay, kueue, url, ca):
    convert = set()
    for f in sorted((kueue / "crd-conversion").glob("*.yaml")):
        convert |= {d["metadata"]["name"] for d in load_all(f)}
    objs = []
    for f in sorted((kuberay / "crds").glob("*.yaml")) + sorted((kueue / "crds").glob("*.yaml")):
        for crd in load_all(f):
            if crd["metadata"]["name"] in convert:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {"clientConfig": {"url": url + "/convert", "caBundle": ca},
                                "conversionReviewVersions": ["v1"]},
                }
            objs.append(crd)
    return objs


def served(hook):
    for rule in hook.get("rules", []):
        groups, resources = set(rule.get("apiGroups", [])), set(rule.get("resources", []))
        if "kueue.x-k8s.io" in groups or ("ray.io" in groups and resources & RAY_KINDS):
            return True
    return False


def webhooks(kueue, url, ca):
    objs = []
    for conf in load_all(kueue / "webhook" / "manifests.yaml"):
        conf["metadata"]["name"] = "kueue-" + conf["metadata"]["name"]
        conf["webhooks"] = [h for h in conf["webhooks"] if served(h)]
        for h in conf["webhooks"]:
            h["clientConfig"] = {"url": url + h["clientConfig"]["service"]["path"], "caBundle": ca}
        objs.append(conf)
    return objs


def main(argv):
    kuberay, kueue, url = pathlib.Path(argv[1]), pathlib.Path(argv[2]), argv[3]
    ca = base64.b64encode(pathlib.Path(argv[4]).read_bytes()).decode()
    what = argv[5]
    kwok = pathlib.Path(argv[6]) if len(argv) > 6 and argv[6] else None
    items = {"rbac": lambda: rbac(kuberay, kueue, kwok), "crds": lambda: crds(kuberay, kueue, url, ca),
             "webhooks": lambda: webhooks(kueue, url, ca)}[what]()
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv)
