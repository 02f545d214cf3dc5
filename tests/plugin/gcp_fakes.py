"""In-process fakes of the two Google APIs with no emulator: IAM Admin (service accounts and their
IAM policies) and Service Usage. They keep the real APIs' semantics where this plugin depends on
them: 409 ALREADY_EXISTS on create, 404 NOT_FOUND, 403 PERMISSION_DENIED naming the permission
(with a google.rpc.ErrorInfo), and etag-checked setIamPolicy answering 409 ABORTED when stale.
IAM's eventual consistency and its permanent errors are there too: ``not_found_after_create`` makes
the policy of a service account created a moment ago answer 404 for that many calls (as real IAM
does right after createServiceAccount), and ``workload_pools`` lists the projects whose Workload
Identity pool exists (a member of another pool gets real IAM's 400 "Identity Pool does not exist").
They record every call, so tests can assert that a dry run mutated nothing."""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import iam_admin_v1, service_usage_v1
from google.iam.v1 import policy_pb2
from google.rpc import error_details_pb2

ALL = "*"
_POOL_RE = re.compile(r"^serviceAccount:(?P<project>[a-z0-9.:-]+)\.svc\.id\.goog\[")


def _denied(permission: str, resource: str) -> gexc.PermissionDenied:
    info = error_details_pb2.ErrorInfo(reason="IAM_PERMISSION_DENIED", domain="iam.googleapis.com",
                                       metadata={"permission": permission, "resource": resource})
    return gexc.PermissionDenied(f"Permission '{permission}' denied on resource '{resource}' (or it may not exist).",
                                 details=[info], error_info=info)  # as from_grpc_error builds it


def _req(request: Any) -> dict[str, Any]:
    return dict(request or {})


@dataclass
class FakeIAM:
    """The subset of ``iam_admin_v1.IAMClient`` the plugin calls."""

    allowed: set[str] | str = ALL
    accounts: dict[str, iam_admin_v1.ServiceAccount] = field(default_factory=dict)
    policies: dict[str, policy_pb2.Policy] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    read_barrier: threading.Barrier | None = None  # forces concurrent read-modify-writes to interleave
    conflicts: int = 0
    not_found_after_create: int = 0
    workload_pools: set[str] | None = None  # None: every project's pool exists
    _young: dict[str, int] = field(default_factory=dict)  # email -> 404s still to answer
    _lock: threading.Lock = field(default_factory=threading.Lock)

    MUTATING = ("create_service_account", "delete_service_account", "set_iam_policy")

    def _check(self, permission: str, resource: str) -> None:
        if self.allowed != ALL and permission not in self.allowed:
            raise _denied(permission, resource)

    @staticmethod
    def _email(name: str) -> str:
        return name.rsplit("/", 1)[-1]

    def create_service_account(self, request: Any = None) -> iam_admin_v1.ServiceAccount:
        r = _req(request)
        project = r["name"].removeprefix("projects/")
        self.calls.append(("create_service_account", r["account_id"]))
        self._check("iam.serviceAccounts.create", r["name"])
        email = f"{r['account_id']}@{project}.iam.gserviceaccount.com"
        with self._lock:
            if email in self.accounts:
                raise gexc.AlreadyExists(f"Service account {r['account_id']} already exists within project {r['name']}.")
            sa = iam_admin_v1.ServiceAccount(name=f"projects/{project}/serviceAccounts/{email}", email=email,
                                             project_id=project, **r.get("service_account", {}))
            self.accounts[email] = sa
            self.policies[email] = policy_pb2.Policy(version=1, etag=b"\x00\x00\x00\x01")
            if self.not_found_after_create:
                self._young[email] = self.not_found_after_create
        return sa

    def _not_yet_visible(self, resource: str) -> None:
        email = self._email(resource)
        with self._lock:
            if self._young.get(email, 0) > 0:
                self._young[email] -= 1
                raise gexc.NotFound(f"Service account {resource} does not exist.")

    def _check_pools(self, policy: policy_pb2.Policy) -> None:
        if self.workload_pools is None:
            return
        for b in policy.bindings:
            for m in b.members:
                pool = _POOL_RE.match(m)
                if pool and pool["project"] not in self.workload_pools:
                    raise gexc.BadRequest(
                        f"Identity Pool does not exist ({pool['project']}.svc.id.goog). Please check that you "
                        "specified a valid resource name as returned in the `name` attribute in the configuration API.")

    def get_service_account(self, request: Any = None) -> iam_admin_v1.ServiceAccount:
        name = _req(request)["name"]
        self.calls.append(("get_service_account", name))
        self._check("iam.serviceAccounts.get", name)
        try:
            return self.accounts[self._email(name)]
        except KeyError:
            raise gexc.NotFound(f"Service account {name} does not exist.") from None

    def delete_service_account(self, request: Any = None) -> None:
        name = _req(request)["name"]
        self.calls.append(("delete_service_account", name))
        self._check("iam.serviceAccounts.delete", name)
        with self._lock:
            if self.accounts.pop(self._email(name), None) is None:
                raise gexc.NotFound(f"Service account {name} does not exist.")
            self.policies.pop(self._email(name), None)

    def get_iam_policy(self, request: Any = None) -> policy_pb2.Policy:
        resource = _req(request)["resource"]
        self.calls.append(("get_iam_policy", resource))
        self._check("iam.serviceAccounts.getIamPolicy", resource)
        self._not_yet_visible(resource)
        with self._lock:
            if self._email(resource) not in self.policies:
                raise gexc.NotFound(f"Service account {resource} does not exist.")
            copy = policy_pb2.Policy()
            copy.CopyFrom(self.policies[self._email(resource)])
        if self.read_barrier is not None:
            self.read_barrier.wait()
        return copy

    def set_iam_policy(self, request: Any = None) -> policy_pb2.Policy:
        r = _req(request)
        resource, policy = r["resource"], r["policy"]
        self.calls.append(("set_iam_policy", resource))
        self._check("iam.serviceAccounts.setIamPolicy", resource)
        self._not_yet_visible(resource)
        self._check_pools(policy)
        with self._lock:
            current = self.policies.get(self._email(resource))
            if current is None:
                raise gexc.NotFound(f"Service account {resource} does not exist.")
            if policy.etag and policy.etag != current.etag:
                self.conflicts += 1
                raise gexc.Aborted("There were concurrent policy changes. Please retry the whole read-modify-write "
                                   "with exponential backoff.")
            stored = policy_pb2.Policy()
            stored.CopyFrom(policy)
            stored.etag = (int.from_bytes(current.etag, "big") + 1).to_bytes(4, "big")
            self.policies[self._email(resource)] = stored
        if self.read_barrier is not None:
            self.read_barrier = None  # only the first round interleaves
        return stored

    def mutations(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in self.MUTATING]


class _Done:
    def result(self, timeout: float | None = None) -> None:
        return None


@dataclass
class FakeServiceUsage:
    """The subset of ``service_usage_v1.ServiceUsageClient`` the plugin calls."""

    project_number: str
    enabled: set[str] = field(default_factory=set)
    allowed: set[str] | str = ALL
    self_disabled: bool = False  # the Service Usage API itself is off in the project
    calls: list[tuple[str, str]] = field(default_factory=list)

    def _guard(self, permission: str, resource: str) -> None:
        if self.self_disabled:
            info = error_details_pb2.ErrorInfo(
                reason="SERVICE_DISABLED", domain="googleapis.com",
                metadata={"service": "serviceusage.googleapis.com", "consumer": f"projects/{self.project_number}"})
            raise gexc.PermissionDenied(
                f"Service Usage API has not been used in project {self.project_number} before or it is disabled.",
                details=[info], error_info=info)  # as from_grpc_error builds it
        if self.allowed != ALL and permission not in self.allowed:
            raise _denied(permission, resource)

    def get_service(self, request: Any = None) -> service_usage_v1.Service:
        name = _req(request)["name"]
        self.calls.append(("get_service", name))
        self._guard("serviceusage.services.get", name)
        service = name.rsplit("/", 1)[-1]
        state = service_usage_v1.State.ENABLED if service in self.enabled else service_usage_v1.State.DISABLED
        return service_usage_v1.Service(name=f"projects/{self.project_number}/services/{service}",
                                        parent=f"projects/{self.project_number}", state=state)

    def batch_enable_services(self, request: Any = None) -> _Done:
        r = _req(request)
        self.calls.append(("batch_enable_services", ",".join(r["service_ids"])))
        self._guard("serviceusage.services.enable", r["parent"])
        self.enabled.update(r["service_ids"])
        return _Done()

    def mutations(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] == "batch_enable_services"]


class EtagBucketIam:
    """Cloud Storage's bucket IAM endpoint with the real API's etag check, in front of an emulator
    whose own endpoint stores policies without one: a requests session for google-cloud-storage
    that answers GET/PUT ``/storage/v1/b/BUCKET/iam`` itself (412 Precondition Failed on a stale
    etag, a new etag on every write) and sends everything else to the emulator."""

    _IAM_RE = re.compile(r"/storage/v1/b/(?P<bucket>[^/?]+)/iam(?:\?|$)")

    def __init__(self, read_barrier: threading.Barrier | None = None) -> None:
        self.policies: dict[str, dict[str, Any]] = {}
        self.conflicts = 0
        self.read_barrier = read_barrier
        self._lock = threading.Lock()

    def session(self) -> Any:
        import requests

        fake = self

        class Session(requests.Session):
            def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
                m = fake._IAM_RE.search(url)
                if m is None:
                    return super().request(method, url, *args, **kwargs)
                return fake._answer(method, url, m["bucket"], kwargs.get("data"))

        return Session()

    def _answer(self, method: str, url: str, bucket: str, data: Any) -> Any:
        import requests

        with self._lock:
            policy = self.policies.setdefault(bucket, {"kind": "storage#policy", "version": 1, "etag": "CAE=",
                                                        "resourceId": f"projects/_/buckets/{bucket}", "bindings": []})
        if method == "GET":
            body, status = dict(policy), 200
            if self.read_barrier is not None:
                self.read_barrier.wait()
        else:
            sent = json.loads(data or "{}")
            with self._lock:
                current = self.policies[bucket]
                if sent.get("etag") and sent["etag"] != current["etag"]:
                    self.conflicts += 1
                    self.read_barrier = None  # only the first round interleaves
                    body, status = {"error": {"code": 412, "message": "Precondition Failed"}}, 412
                else:
                    n = int.from_bytes(base64.b64decode(current["etag"]), "big") + 1
                    stored = {**current, "version": sent.get("version", 1), "bindings": sent.get("bindings", []),
                              "etag": base64.b64encode(n.to_bytes(4, "big")).decode()}
                    self.policies[bucket] = stored
                    body, status = dict(stored), 200
        resp = requests.Response()
        resp.status_code = status
        resp._content = json.dumps(body).encode()  # noqa: SLF001 - building a response
        resp.headers["Content-Type"] = "application/json"
        resp.url = url
        resp.request = requests.Request(method, url).prepare()
        return resp
