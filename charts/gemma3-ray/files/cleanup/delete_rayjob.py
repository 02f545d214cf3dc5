"""The chart's cleanup hook (pre-upgrade, pre-rollback, pre-delete): delete this release's RayJob and
wait until it is gone.

KubeRay stops the Ray job when its RayJob is deleted (a finalizer), and the cluster it created for
the job is the RayJob's dependent, so a foreground deletion returns only when the job is stopped and
its cluster is gone: the GPUs are free before the next revision's job starts, or before
`helm uninstall` removes the ServiceAccount, Secret and ConfigMap the job uses. Standard library only (it runs in the Ray image, with the pod's
ServiceAccount token, which may get and delete this one RayJob and nothing else).

Environment: NAMESPACE, RAYJOB_NAME, TIMEOUT_SECONDS; KUBERNETES_SERVICE_HOST/_PORT (set in every
pod); SERVICEACCOUNT_DIR (default: the pod's mounted token, CA and namespace).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
POLL_S = 1.0
REQUEST_TIMEOUT_S = 30.0
FOREGROUND = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}


class Api:
    """Just enough of the Kubernetes API: one object's URL, the pod's token and CA."""

    def __init__(self, url: str, sa_dir: str):
        self.url, self.sa_dir = url, sa_dir
        self.tls = ssl.create_default_context(cafile=os.path.join(sa_dir, "ca.crt"))

    def call(self, method: str, body: dict | None = None) -> tuple[int, dict]:
        with open(os.path.join(self.sa_dir, "token")) as f:  # re-read: projected tokens rotate
            token = f.read().strip()
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S, context=self.tls) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {}


def object_url(namespace: str, name: str) -> str:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}:{port}/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}"


def run(api: Api, what: str, timeout_s: float) -> int:
    code, body = api.call("DELETE", FOREGROUND)
    if code == 404:
        print(f"{what}: not found; nothing to stop", flush=True)
        return 0
    if code not in (200, 202):
        print(f"{what}: delete failed (HTTP {code}): {body.get('message', '')}", file=sys.stderr, flush=True)
        return 1
    print(f"{what}: deleting (KubeRay stops the Ray job; its cluster and submitter go with it)", flush=True)
    started = time.monotonic()
    while True:
        code, body = api.call("GET")
        if code == 404:
            print(f"{what}: gone after {time.monotonic() - started:.0f} s", flush=True)
            return 0
        if code != 200:
            print(f"{what}: cannot check the deletion (HTTP {code}): {body.get('message', '')}", file=sys.stderr, flush=True)
            return 1
        if time.monotonic() - started > timeout_s:
            finalizers = ", ".join(body.get("metadata", {}).get("finalizers") or []) or "none"
            print(f"{what}: still present after {timeout_s:.0f} s (finalizers: {finalizers}); is the KubeRay "
                  "operator running? Training may still hold GPUs: check `kubectl get rayjob,raycluster`",
                  file=sys.stderr, flush=True)
            return 1
        time.sleep(POLL_S)


def main() -> int:
    namespace, name = os.environ["NAMESPACE"], os.environ["RAYJOB_NAME"]
    api = Api(object_url(namespace, name), os.environ.get("SERVICEACCOUNT_DIR", SA_DIR))
    return run(api, f"RayJob {namespace}/{name}", float(os.environ.get("TIMEOUT_SECONDS", "240")))


if __name__ == "__main__":
    sys.exit(main())
