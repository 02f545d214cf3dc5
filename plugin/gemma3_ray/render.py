"""The chart's values file, rendered with ruamel.yaml: comments and key order survive, output is stable.

Only the keys this module owns (``VALUE_PATHS``) are written; when an existing values file is given,
it is updated in place, so everything else in it (other keys, comments, order) is kept byte for byte.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from gemma3_ray.deployment import Deployment
from gemma3_ray.errors import ConfigError
from gemma3_ray.machine_shapes import GPU_MEMORY_GB, Shape, node_resources

YAML_WIDTH = 4096  # never fold long strings: folding would make the output depend on line lengths


@dataclass(frozen=True)
class Value:
    path: tuple[str, ...]
    value: Any
    comment: str


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = YAML_WIDTH
    y.preserve_quotes = True
    return y


def owned_values(dep: Deployment) -> list[Value]:
    """The values this plugin sets, in the order they are written. Key names follow the chart's values.yaml."""
    out = [
        Value(("serviceAccount", "create"), True, "the chart creates the Kubernetes ServiceAccount the Ray pods run as"),
        Value(("serviceAccount", "name"), dep.ksa,
              f"its name; `gemma3-ray prereqs` lets {dep.namespace}/{dep.ksa} act as the Google service account"),
        Value(("serviceAccount", "gcpServiceAccount"), dep.gsa_email,
              "Workload Identity: annotation iam.gke.io/gcp-service-account (object admin on the bucket only)"),
        Value(("hfToken", "existingSecret"), dep.hf_secret,
              "Secret with the Hugging Face token (`gemma3-ray prereqs --hf-token-from-env HF_TOKEN` creates it)"),
        Value(("hfToken", "secretKey"), dep.hf_secret_key, "key of the token inside that Secret"),
        Value(("storage", "bucket"), dep.bucket, f"bucket in {dep.region} (uniform access, public access prevention)"),
        Value(("storage", "prefix"), dep.prefix, "checkpoints, final adapter, metrics.jsonl and summary.json land here"),
        Value(("workers", "replicas"), dep.replicas, "GPU nodes (one Ray worker pod each)"),
    ]
    shape: Shape | None = dep.shape
    if shape is not None:
        what = shape.machine_type or "the reservation"
        out += [
            Value(("workers", "gpusPerNode"), shape.gpus_per_node, f"GPUs of one {what} node"),
            Value(("workers", "accelerator"), shape.accelerator, "node selector cloud.google.com/gke-accelerator"),
        ]
        resources = node_resources(shape)
        if resources is not None:
            cpu, memory = resources
            res = CommentedMap()
            for kind in ("requests", "limits"):
                res[kind] = CommentedMap([("cpu", str(cpu)), ("memory", memory)])
            out.append(Value(("workers", "resources"), res, f"fits one {shape.machine_type} node next to GKE's system pods"))
        out += training_for_gpu(shape.accelerator)
    if dep.reservation:
        out += [
            Value(("capacity", "type"), "reservation", "GPU workers consume the reservation"),
            Value(("capacity", "reservation"), dep.reservation, "reservation name (or projects/P/reservations/N)"),
        ]
    return out


# The trainer's fast recipe (batch 12) peaks at 108 GiB per GPU on Gemma 3 4B, batch 8 at 71 GiB
# (bench/RESULTS.md, H200). Smaller GPUs get a smaller batch, or the tutorial's 4-bit recipe.
FAST_RECIPE_MIN_GB = 140
FAST_RECIPE_SMALL_BATCH = 6  # 80-96 GB GPUs: headroom under the 71 GiB measured at batch 8
FAST_RECIPE_SMALL_MIN_GB = 80


def training_for_gpu(accelerator: str) -> list[Value]:
    """Trainer flags that make the default model fit the GPU (nothing for GPUs of 140 GB and more)."""
    memory = GPU_MEMORY_GB.get(accelerator)
    if memory is None or memory >= FAST_RECIPE_MIN_GB:
        return []
    if memory >= FAST_RECIPE_SMALL_MIN_GB:
        return [Value(("training", "per_device_train_batch_size"), FAST_RECIPE_SMALL_BATCH,
                      f"{accelerator} ({memory} GB): the fast recipe at batch {FAST_RECIPE_SMALL_BATCH} "
                      "(its default 12 needs ~108 GiB on Gemma 3 4B; bench/RESULTS.md)")]
    return [Value(("training", "recipe"), "tutorial",
                  f"{accelerator} ({memory} GB): the tutorial's QLoRA recipe (4-bit, checkpointing, batch 1 x 4) fits; "
                  "the fast recipe needs ~71-108 GiB on Gemma 3 4B (bench/RESULTS.md)")]


def header(dep: Deployment) -> str:
    src = dep.sources
    origin = []
    if src.gcloud_configuration:
        origin.append(f"gcloud configuration '{src.gcloud_configuration}'")
    if src.kube_context:
        origin.append(f"kube context '{src.kube_context}'")
    if src.flags:
        origin.append("flags " + ", ".join("--" + f.replace("_", "-") for f in src.flags))
    lines = [
        "Values for the gemma3-ray chart, written by `gemma3-ray values` (re-running it updates only the keys it owns).",
        f"project {dep.project}, region {dep.region}" + (f", cluster {dep.cluster}" if dep.cluster else "")
        + (f", namespace {dep.namespace}" if dep.namespace else ""),
    ]
    if origin:
        lines.append("from " + "; ".join(origin))
    lines.append(f"install: helm upgrade --install {dep.release} charts/gemma3-ray -n {dep.namespace} -f THIS_FILE")
    return "\n".join(lines)


def _set(doc: CommentedMap, item: Value, comment_new: bool) -> None:
    node = doc
    for key in item.path[:-1]:
        child = node.get(key)
        if not isinstance(child, CommentedMap):
            child = CommentedMap()
            node[key] = child
        node = child
    key = item.path[-1]
    existed = key in node
    node[key] = item.value
    if comment_new and not existed:
        node.yaml_set_comment_before_after_key(key, before=item.comment, indent=2 * (len(item.path) - 1))


def load(path: Path) -> CommentedMap:
    try:
        doc = _yaml().load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return CommentedMap()
    except Exception as exc:
        raise ConfigError(f"Cannot parse {path} as YAML: {exc}; fix it or write to a new file.") from exc
    if doc is None:
        return CommentedMap()
    if not isinstance(doc, CommentedMap):
        raise ConfigError(f"{path} is not a YAML mapping; write the values to a new file instead.")
    return doc


def load_plain(path: Path) -> dict[str, Any]:
    """A values file as plain dicts and lists (what helm, pyhelm3 and the schema checks take)."""
    try:
        doc = YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"No values file {path}: check the path.") from exc
    except Exception as exc:
        raise ConfigError(f"Cannot parse {path} as YAML: {exc}; fix it.") from exc
    if not isinstance(doc, dict | type(None)):
        raise ConfigError(f"{path} is not a YAML mapping; fix it.")
    return doc or {}


def render(dep: Deployment, existing: CommentedMap | None = None, extra: Iterable[Value] = ()) -> str:
    """The values YAML: a fresh document, or ``existing`` updated in place (its other content kept)."""
    fresh = existing is None or len(existing) == 0
    doc = CommentedMap() if existing is None else existing
    for item in [*owned_values(dep), *extra]:
        _set(doc, item, comment_new=True)
    if fresh:
        doc.yaml_set_start_comment(header(dep))
    buf = io.StringIO()
    _yaml().dump(doc, buf)
    return buf.getvalue()
