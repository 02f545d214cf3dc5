"""The translation of Google API errors into one actionable sentence."""

from __future__ import annotations

import pytest
from gemma3_ray.utils.errors import ApiDisabled, NotFound, PermissionDenied, translate
from google.api_core import exceptions as gexc


@pytest.mark.parametrize(("exc", "permission", "role"), [
    (gexc.Forbidden("POST https://storage.googleapis.com/storage/v1/b?project=p: ml@p.iam.gserviceaccount.com does "
                    "not have storage.buckets.create access to the Google Cloud project. Permission "
                    "'storage.buckets.create' denied on resource (or it may not exist)."),
     "storage.buckets.create", "roles/storage.admin"),
    (gexc.Forbidden("GET https://storage.googleapis.com/storage/v1/b/x/iam: ml@p.iam.gserviceaccount.com does not "
                    "have storage.buckets.getIamPolicy access to the Google Cloud Storage bucket."),
     "storage.buckets.getIamPolicy", "roles/storage.admin"),
    (gexc.PermissionDenied("Permission 'iam.serviceAccounts.setIamPolicy' denied on resource (or it may not exist)."),
     "iam.serviceAccounts.setIamPolicy", "roles/iam.serviceAccountAdmin"),
])
def test_permission_denied_names_permission_and_role(exc: Exception, permission: str, role: str) -> None:
    err = translate(exc, "change", "gs://x")
    assert isinstance(err, PermissionDenied)
    assert f"'{permission}'" in str(err) and role in str(err)


def test_disabled_api_from_a_storage_style_message() -> None:
    exc = gexc.Forbidden("Cloud Storage JSON API has not been used in project 123 before or it is disabled. Enable it "
                         "by visiting https://console.developers.google.com/apis/api/storage-api.googleapis.com/overview"
                         "?project=123 then retry.")
    err = translate(exc, "read", "gs://x")
    assert isinstance(err, ApiDisabled) and "storage-api.googleapis.com" in str(err)


def test_not_found_and_other_errors_are_one_sentence() -> None:
    assert isinstance(translate(gexc.NotFound("no"), "read", "gs://x"), NotFound)
    other = translate(gexc.InternalServerError("boom"), "read", "gs://x")
    assert str(other) == "Could not read gs://x: 500 boom; a Google-side or quota error: try again in a minute."


def test_the_api_disabled_hint_names_only_real_commands() -> None:
    """Issue #12 (6): a hint names only commands and flags that exist (#19: `prereqs --apply` now does)."""
    from gemma3_ray import cli
    from gemma3_ray.utils.errors import api_disabled

    for service in ("storage.googleapis.com", "serviceusage.googleapis.com"):
        text = str(api_disabled(service, "123"))
        assert f"gcloud services enable {service} --project 123" in text
    assert "`gemma3-ray prereqs --apply`" in str(api_disabled("storage.googleapis.com", "1"))
    assert cli.build_parser().parse_args(["prereqs", "--apply"]).apply is True  # and indeed: the flag exists
    assert "prereqs" not in str(api_disabled("serviceusage.googleapis.com", "1"))  # it cannot enable itself


def test_a_missing_workload_pool_is_one_sentence_with_the_fix() -> None:
    exc = gexc.BadRequest("Identity Pool does not exist (demo-proj-1.svc.id.goog). Please check that you specified "
                          "a valid resource name as returned in the `name` attribute in the configuration API.")
    text = str(translate(exc, "set the IAM policy of", "projects/demo-proj-1/serviceAccounts/x@y"))
    assert "--workload-pool=demo-proj-1.svc.id.goog" in text and "gcloud container clusters update" in text
    assert "\n" not in text


def test_unknown_google_errors_still_say_what_to_do() -> None:
    text = str(translate(gexc.ServiceUnavailable("backend\nerror"), "read", "gs://x"))
    assert text == "Could not read gs://x: 503 backend; a Google-side or quota error: try again in a minute."
