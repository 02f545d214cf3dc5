"""GitOps by `helm template | kubectl apply` leaves the `helm test` pod out (#27 item 8).

A rendered manifest holds the test pod too, and kubectl would create it like any object. The chart's
README says how to leave it out (`helm template --skip-tests`, or `tests.enabled=false`); this checks
that both helms' `--skip-tests` drop exactly that pod, and that the pod carries the `helm.sh/hook: test`
annotation Argo CD reads as a Helm hook it does not sync (gitops-engine maps only pre/post-install and
pre/post-upgrade to sync phases; an object with any other `helm.sh/hook` is a hook without a phase).
"""

from __future__ import annotations

import pytest
from helm_render import CHART, CI_VALUES_DIR, helm_template, same_but_run_name

CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
HOOK = "helm.sh/hook"
# The helm.sh/hook values Argo CD's gitops-engine turns into sync phases (pkg/sync/hook/helm/type.go).
ARGO_SYNCED_HELM_HOOKS = {"pre-install", "pre-upgrade", "post-install", "post-upgrade"}
README = (CHART / "README.md").read_text()


@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
def test_skip_tests_renders_everything_but_the_test_pod(helm: str) -> None:
    full = helm_template([CI_DEFAULT], helm=helm)
    skipped = helm_template([CI_DEFAULT], helm=helm, extra_args=("--skip-tests",))
    assert full.returncode == 0 and skipped.returncode == 0, full.stderr + skipped.stderr
    assert [d["kind"] for d in full.docs if HOOK in d["metadata"].get("annotations", {})] == ["Pod"]
    assert not skipped.kinds("Pod")
    assert same_but_run_name(skipped.docs) == same_but_run_name([d for d in full.docs if d["kind"] != "Pod"])


def test_the_test_pod_is_a_helm_test_hook_that_argo_cd_does_not_sync() -> None:
    pod = helm_template([CI_DEFAULT], set_values={"commonAnnotations": {"team": "vision"}}).one("Pod")
    ann = pod["metadata"]["annotations"]
    assert ann[HOOK] == "test" and ann[HOOK] not in ARGO_SYNCED_HELM_HOOKS
    assert "hook-succeeded" in ann["helm.sh/hook-delete-policy"]
    assert not any(k.startswith("argocd.argoproj.io/hook") for k in ann), "an Argo CD hook would override Helm's"


def test_readme_gitops_section_says_how_to_leave_the_test_pod_out() -> None:
    start = README.index("- **Argo CD**")
    section = README[start:README.index("- **Flux**", start)]
    assert "helm template --skip-tests" in section and "tests.enabled=false" in section
    assert "helm.sh/hook: test" in section
