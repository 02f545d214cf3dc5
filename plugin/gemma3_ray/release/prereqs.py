"""The Google Cloud prerequisites Helm cannot create: plan (read-only), then apply (idempotent).

A release (namespace + release name) gets identities and grants of its own, least privilege first:
- the APIs the training run needs, enabled;
- the bucket the releases share, in the cluster's region, hardened (``bucket_setup``);
- the release's own Google service account (GSA; ``g3r-<release>-<hash>`` unless ``--gsa-name``),
  its description naming the release that created it;
- on the bucket, the release's conditional grant (``grants``): ``roles/storage.objectUser`` on its
  prefix only — never another release's objects — and the directory object ``PREFIX/`` that keeps
  the job's file system inside that prefix (see ``grants``);
- on its GSA only: ``roles/iam.workloadIdentityUser`` for
  ``serviceAccount:PROJECT.svc.id.goog[NAMESPACE/KSA]`` (the Kubernetes service account may act as it);
- optionally, the Hugging Face token Secret in the cluster (the token comes from a file, stdin or an
  environment variable, never from the command line, and is never printed).

``plan()`` makes only read calls; without credentials ``offline_plan()`` lists every step as "not
checked". ``apply()`` re-checks each step as it goes (another run may have done it meanwhile) and
edits IAM policies by read-modify-write with etags, retried on conflict and on IAM's 404 right after
the service account was created. Each step is a :class:`Step`; ``steps()`` is the list to extend.
``run()`` is the command (`prereqs`, and `up`'s prerequisites): the plan printed, then applied.
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc

from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gcp import bucket_setup, grants, iam_policy, iam_preflight, services
from gemma3_ray.gcp.artifact_registry import RegistryPrereqs
from gemma3_ray.utils import names
from gemma3_ray.utils import plan as plans
from gemma3_ray.utils.errors import NotLoggedIn, UserError, call_google
from gemma3_ray.utils.plan import Action, Plan

REQUIRED_SERVICES = (
    "container.googleapis.com",
    "storage.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",  # Workload Identity's token exchange
)
WORKLOAD_IDENTITY_ROLE = "roles/iam.workloadIdentityUser"
# What `prereqs` may call, for the testIamPermissions preflight (before any change, and in `doctor`).
PERMISSIONS = ("serviceusage.services.get", "serviceusage.services.enable", "storage.buckets.create",
               "storage.buckets.get", "storage.buckets.update", "storage.buckets.getIamPolicy",
               "storage.buckets.setIamPolicy", "storage.objects.get", "storage.objects.create",
               "iam.serviceAccounts.create", "iam.serviceAccounts.get", "iam.serviceAccounts.getIamPolicy",
               "iam.serviceAccounts.setIamPolicy")
# Only the project (or above) can grant these; the others may come from a grant on the bucket or the account.
PROJECT_ONLY = ("serviceusage.services.enable", "storage.buckets.create", "iam.serviceAccounts.create")
# `--image` adds the Artifact Registry repository: what that may call, and what only the project can grant.
IMAGE_PERMISSIONS = ("artifactregistry.repositories.get", "artifactregistry.repositories.create",
                     "artifactregistry.repositories.getIamPolicy", "artifactregistry.repositories.setIamPolicy")
IMAGE_PROJECT_ONLY = ("artifactregistry.repositories.create",)
SECRET_LABEL = "app.kubernetes.io/managed-by"
_OWNER_RE = re.compile(r"release (?P<owner>[a-z0-9-]+/[a-z0-9-]+) \(created by")


def gsa_description(dep: Deployment) -> str:
    return f"Ray training pods of {names.PRODUCT} release {dep.owner} (created by `{names.PRODUCT} prereqs`)"


def gsa_owner(description: str) -> str | None:
    """The release (``namespace/release``) whose `prereqs` created a service account, else None."""
    m = _OWNER_RE.search(description or "")
    return m["owner"] if m else None


@dataclass(frozen=True)
class Step:
    """One prerequisite: what it ensures (no API call), and its check (reads; adds to the plan)."""

    describe: Callable[[], list[str]]
    check: Callable[[Plan], None]
    google: bool = True  # its check reads Google Cloud (without credentials it is only described)


class Prereqs:
    """Plans and applies the prerequisites of one release."""

    def __init__(self, dep: Deployment, clients: Clients, hf_token: str | None = None,
                 cluster_unread: str = "") -> None:
        self.dep = dep
        self.clients = clients
        self.hf_token = hf_token
        self.cluster_unread = cluster_unread  # why the cluster is not read (a plan without a kube context)
        self.project_number: str | None = None
        self.bucket: Any | None = None
        self.gsa_exists = False
        self.gsa_created = False  # by this run: IAM may still answer 404 for it

    def steps(self) -> list[Step]:
        return [
            Step(lambda: [f"APIs enabled: {', '.join(REQUIRED_SERVICES)}"], self._services),
            Step(lambda: [bucket_setup.describe(self.dep)], self._bucket),
            Step(lambda: [self._gsa_text()], self._gsa),
            Step(lambda: [g.text(self.dep.bucket) for g in self._grants()], self._bucket_grants),
            Step(lambda: [self._folder_text()], self._folder),
            Step(lambda: [self._wi_text()], self._wi_binding),
            Step(lambda: [self._secret_text()] if self.hf_token is not None else [], self._hf_secret, google=False),
        ]

    def plan(self) -> Plan:
        """Every change needed, found with read calls only."""
        plan = Plan()
        for step in self.steps():
            step.check(plan)
        return plan

    def offline_plan(self) -> Plan:
        """What `plan` would check, without a Google API call (no credentials); the Secret is the cluster's."""
        plan = Plan()
        for step in self.steps():
            if step.google:
                plan.unchecked += step.describe()
            else:
                step.check(plan)
        return plan

    def apply(self, plan: Plan, log: Callable[[str], None]) -> None:
        for action in plan.actions:
            log(f"  ... {action.text}")
            action.run()

    # -- APIs ------------------------------------------------------------------------------------
    def _services(self, plan: Plan) -> None:
        state = services.read(self.clients, self.dep.project, REQUIRED_SERVICES)
        self.project_number = state.project_number
        if not state.disabled:
            plan.in_place.append(f"APIs enabled: {', '.join(REQUIRED_SERVICES)}")
            return
        plan.actions.append(Action(f"enable APIs: {', '.join(state.disabled)}",
                                   lambda: services.enable(self.clients, self.dep.project, state.disabled)))

    # -- bucket ----------------------------------------------------------------------------------
    def _bucket(self, plan: Plan) -> None:
        self.bucket = bucket_setup.read(self.dep, self.clients, self.project_number)
        if self.bucket is None:
            plan.actions.append(Action(f"create {bucket_setup.describe(self.dep)}",
                                       lambda: bucket_setup.create(self.dep, self.clients, self.project_number)))
            return
        if not bucket_setup.hardened(self.bucket):
            plan.actions.append(Action(
                f"enforce uniform bucket-level access and public access prevention on gs://{self.dep.bucket}",
                lambda b=self.bucket: bucket_setup.harden(b)))
        else:
            plan.in_place.append(f"bucket gs://{self.dep.bucket} ({self.bucket.location})")

    # -- the release's Google service account ----------------------------------------------------
    def _gsa_text(self) -> str:
        return f"Google service account {self.dep.gsa_email} of release {self.dep.owner}"

    def read_gsa(self) -> Any | None:
        iam = self.clients.get_iam()
        try:
            return call_google("read", self.dep.gsa_resource,
                               lambda: iam.get_service_account(request={"name": self.dep.gsa_resource}), not_found=True)
        except gexc.NotFound:
            return None

    def _create_gsa(self) -> None:
        iam = self.clients.get_iam()
        request = {
            "name": f"projects/{self.dep.project}",
            "account_id": self.dep.gsa_id,
            "service_account": {"display_name": f"{names.PRODUCT} {self.dep.owner}"[:100],
                                "description": gsa_description(self.dep)},
        }
        try:
            call_google("create", self.dep.gsa_resource, lambda: iam.create_service_account(request=request),
                        expect=(gexc.AlreadyExists,))
            self.gsa_created = True
        except gexc.AlreadyExists:
            return  # a concurrent run created it

    def _gsa(self, plan: Plan) -> None:
        gsa = self.read_gsa()
        self.gsa_exists = gsa is not None
        if gsa is None:
            plan.actions.append(Action(f"create {self._gsa_text()}", self._create_gsa))
            return
        owner = gsa_owner(gsa.description)
        note = "" if owner in {None, self.dep.owner} else f" (created for release {owner}: shared with it)"
        plan.in_place.append(f"Google service account {self.dep.gsa_email}{note}")

    # -- grants ------------------------------------------------------------------------------------
    def _grants(self) -> tuple[grants.Grant, ...]:
        d = self.dep
        return grants.for_release(d.bucket, d.prefix, d.namespace, d.release, d.gsa_member)

    def _bucket_grants(self, plan: Plan) -> None:
        resource = f"gs://{self.dep.bucket}"
        wanted = self._grants()
        missing = list(wanted)
        if self.bucket is not None and self.gsa_exists:
            policy = call_google("read the IAM policy of", resource, lambda: self._bucket_policy().read())
            missing = [g for g in wanted if not grants.has(policy, g)]
        plan.in_place += [g.text(self.dep.bucket) for g in wanted if g not in missing]
        if not missing:
            return
        desc = grants.description(self.dep.prefix)

        def edit(policy: Any) -> bool:
            todo = [g for g in wanted if not grants.has(policy, g)]
            for g in todo:
                grants.add(policy, g, desc)
            return bool(todo)

        def grant() -> None:
            access = self._bucket_policy()
            call_google("set the IAM policy of", resource, lambda: iam_policy.update(
                access.read, access.write, edit, just_created=self.gsa_created))

        plan.actions.append(Action("grant " + "; ".join(g.text(self.dep.bucket) for g in missing), grant))

    def _folder_text(self) -> str:
        return f"directory object gs://{self.dep.bucket}/{self.dep.prefix}/ (the job's file system stops there)"

    def _folder(self, plan: Plan) -> None:
        name = f"{self.dep.prefix}/"
        if self.bucket is not None:
            blob = call_google("read", f"gs://{self.dep.bucket}/{name}",
                              lambda: self.clients.get_storage().bucket(self.dep.bucket).get_blob(name))
            if blob is not None:
                plan.in_place.append(self._folder_text())
                return

        def create() -> None:
            blob = self.clients.get_storage().bucket(self.dep.bucket).blob(name)
            with contextlib.suppress(gexc.PreconditionFailed):  # it exists (a concurrent run, or the job itself)
                call_google("create", f"gs://{self.dep.bucket}/{name}", lambda: blob.upload_from_string(
                    b"", content_type="application/x-directory", if_generation_match=0), expect=(gexc.PreconditionFailed,))

        plan.actions.append(Action(f"create {self._folder_text()}", create))

    def _bucket_policy(self) -> iam_policy.PolicyAccess:
        return iam_policy.bucket_policy(self.clients.get_storage().bucket(self.dep.bucket))

    def gsa_policy(self) -> iam_policy.PolicyAccess:
        return iam_policy.service_account_policy(self.clients.get_iam(), self.dep.gsa_resource)

    def _wi_text(self) -> str:
        return f"{WORKLOAD_IDENTITY_ROLE} on {self.dep.gsa_email} for {self.dep.wi_member}"

    def _wi_binding(self, plan: Plan) -> None:
        text = self._wi_text()
        if self.gsa_exists:
            policy = call_google("read the IAM policy of", self.dep.gsa_email, lambda: self.gsa_policy().read())
            if self.gsa_policy().has(policy, WORKLOAD_IDENTITY_ROLE, self.dep.wi_member):
                plan.in_place.append(text)
                return

        def grant() -> None:
            call_google("set the IAM policy of", self.dep.gsa_resource, lambda: iam_policy.change_binding(
                self.gsa_policy(), WORKLOAD_IDENTITY_ROLE, self.dep.wi_member, present=True,
                just_created=self.gsa_created))

        plan.actions.append(Action(f"grant {text}", grant))

    # -- the Hugging Face token Secret -------------------------------------------------------------
    def _secret_text(self) -> str:
        return (f"Secret {self.dep.namespace}/{self.dep.hf_secret} with the Hugging Face token under key "
                f"{self.dep.hf_secret_key} (value not shown)")

    def _hf_secret(self, plan: Plan) -> None:
        if self.hf_token is None:
            return
        if self.cluster_unread and self.clients.kube.core is None:
            plan.unread.append((f"create or update {self._secret_text()}", f"cluster not read: {self.cluster_unread}"))
            return
        from gemma3_ray.kube import cluster

        core = self.clients.kube.get_core()
        where = f"Secret {self.dep.namespace}/{self.dep.hf_secret}"
        current = cluster.read_secret(core, self.dep.namespace, self.dep.hf_secret)
        wanted = base64.b64encode(self.hf_token.encode()).decode()
        if current is not None and (current.data or {}).get(self.dep.hf_secret_key) == wanted:
            plan.in_place.append(f"{where} (key {self.dep.hf_secret_key})")
            return
        verb = "create" if current is None else "update"
        plan.actions.append(Action(
            f"{verb} {self._secret_text()}",
            lambda: cluster.put_secret(core, self.dep.namespace, self.dep.hf_secret, self.dep.hf_secret_key,
                                       self.hf_token or "", {SECRET_LABEL: names.PRODUCT})))


def _cluster_unread(clients: Clients, *, needed: bool, planning: bool, use_kube_context: bool) -> str:
    """The cluster's client for the HF Secret; a plan goes on without one and gets why ("" when connected)."""
    if not needed or clients.kube.core is not None:
        return ""
    if planning and not use_kube_context:
        return "--no-kube-context"
    try:
        clients.kube.get_core()
    except UserError as exc:
        if not planning:
            raise
        return str(exc).rstrip(".")
    return ""


def run(dep: Deployment, clients: Clients, *, dry_run: bool, hf_token: str | None, out: Callable[[str], None],
        image: bool = False, apply_hint: str = "gemma3-ray prereqs --apply", use_kube_context: bool = True) -> int:
    """Print the plan of this release's prerequisites (without credentials: what would be checked), and with
    ``dry_run`` False apply it after the permission preflight."""
    unread = _cluster_unread(clients, needed=hf_token is not None, planning=dry_run, use_kube_context=use_kube_context)
    p = Prereqs(dep, clients, hf_token=hf_token, cluster_unread=unread)
    header = f"Prerequisites of release {dep.owner} in project {dep.project}, region {dep.region}:"
    try:
        plan = p.plan()
        if image:  # the Artifact Registry repository and build staging bucket `image build` needs
            RegistryPrereqs(dep, clients).extend(plan)
    except NotLoggedIn:
        if not dry_run:
            raise
        out(header)
        offline = p.offline_plan()
        if image:
            registry = Plan()
            RegistryPrereqs(dep, clients).offline(registry)
            offline.unchecked += [a.text.removesuffix(" [not checked: not logged in]") for a in registry.actions]
        for line in offline.lines():
            out(line)
        out("Not logged in: nothing in Google Cloud was read or changed. To see what exists and what would change, run "
            "`gcloud auth application-default login` and this command again.")
        return 0
    out(header)
    for line in plan.lines():
        out(line)
    if not plan.actions:
        out("Nothing to do: every prerequisite is in place.")
        return 0
    pre = iam_preflight.check(clients, dep.project, PERMISSIONS + (IMAGE_PERMISSIONS if image else ()))
    out(f"  {pre.mark} {pre.line()}")
    if not dry_run:
        pre.require(dep.project, only=PROJECT_ONLY + (IMAGE_PROJECT_ONLY if image else ()))
    if dry_run:
        out(plans.dry_run(len(plan.actions), apply=apply_hint, alternative="`make prereqs APPLY=1`"
                          if apply_hint.startswith("gemma3-ray prereqs") else ""))
        return 0
    out("Applying:")
    p.apply(plan, out)
    out(f"Done: {len(plan.actions)} change(s) applied.")
    return 0
