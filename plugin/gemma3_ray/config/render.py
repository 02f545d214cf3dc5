"""The chart's values file, rendered with ruamel.yaml: comments and key order survive, output is stable.

The keys this module owns (``owned_paths()``) are authoritative: every write sets the ones this run
produces and removes the others (a key from an earlier run for another machine or reservation
must not survive). When an existing values file is given it is updated in place, so everything
else in it (the user's keys, comments, order) is kept. The plugin's own comments are end-of-line
comments of its keys, so they leave with them.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import CommentMark
from ruamel.yaml.tokens import CommentToken

from gemma3_ray.config import fits
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.config.machine_shapes import GPU_MEMORY_GB, Shape, node_resources
from gemma3_ray.utils.errors import ConfigError
from gemma3_ray.utils.tokens import shown

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


def owned_values(dep: Deployment, size: str = "4b") -> list[Value]:
    """The values this plugin sets, in the order they are written (`size`: the Gemma 3 size the release trains, for
    the fit table). Key names follow the chart's values.yaml."""
    out = [
        Value(("serviceAccount", "create"), True, "the chart creates the Kubernetes ServiceAccount the Ray pods run as"),
        Value(("serviceAccount", "name"), dep.ksa,
              f"its name; `gemma3-ray prereqs` lets {dep.namespace}/{dep.ksa} act as the Google service account"),
        Value(("serviceAccount", "gcpServiceAccount"), dep.gsa_email,
              "Workload Identity: this release's own Google service account (objectUser on its prefix only)"),
        Value(("hfToken", "existingSecret"), dep.hf_secret,
              "Secret with the Hugging Face token (`gemma3-ray prereqs --hf-token-file -` creates it)"),
        Value(("hfToken", "secretKey"), dep.hf_secret_key, "key of the token inside that Secret"),
        Value(("storage", "bucket"), dep.bucket, f"bucket in {dep.region} (uniform access, public access prevention)"),
        Value(("storage", "prefix"), dep.prefix, "this release's folder: its runs (checkpoints, adapter, metrics) land under runs/"),
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
        out += training_for_gpu(shape.accelerator, size)
    if dep.reservation:
        out += [
            Value(("capacity", "type"), "reservation", "GPU workers consume the reservation"),
            Value(("capacity", "reservation"), dep.reservation, "reservation name (or projects/P/reservations/N)"),
        ]
    return out


def model_size(layers: list[dict[str, Any]], given: str | None = None) -> str:
    """The Gemma 3 size of the model these values train (`given`, else the last layer's training.model_id, as helm
    merges them, else the chart's default 4B); ConfigError when the id names no size and none is given."""
    training = merged(layers).get("training")
    model = training.get("model_id") if isinstance(training, dict) else None
    return fits.size_of(model if isinstance(model, str) else None, given)


def training_for_gpu(accelerator: str, size: str = "4b") -> list[Value]:
    """Trainer flags that make Gemma 3 `size` fit the GPU, from the measured fit table (config/fits.toml): the
    cell's recipe and micro-batch where they differ from the trainer's defaults (fast, 16). A size that does not fit
    the GPU is refused (ConfigError naming what does); an accelerator the table has no class for gets nothing."""
    cell = fits.fitting(size, accelerator)
    if cell is None:
        return []
    memory = GPU_MEMORY_GB.get(accelerator)
    where = f"{accelerator} ({memory} GB), Gemma 3 {size.upper()}"
    measured = (f"{cell.peak_gib} GiB reserved, {cell.samples_per_s} samples/s a GPU; {cell.source}" if cell.source
                else f"derived from {cell.derived}")
    out = []
    if cell.recipe != "fast":
        out.append(Value(("training", "recipe"), cell.recipe,
                         f"{where}: the tutorial's QLoRA recipe (4-bit, checkpointing) fits; the fit table, fits.toml"))
    if cell.micro_batch != fits.RECIPE_MICRO_BATCH[cell.recipe]:
        out.append(Value(("training", "per_device_train_batch_size"), cell.micro_batch,
                         f"{where}: micro-batch {cell.micro_batch} ({measured})"))
    return out


# The training image's keys (`values --image`, image_build.values): owned like the others, so a run
# without --image removes them (the chart then installs the dependencies through the runtime env).
DEPENDENCIES = ("dependencies",)
IMAGE_REPOSITORY = ("workers", "image", "repository")
IMAGE_TAG = ("workers", "image", "tag")
# Every key the plugin may write; the training keys are whatever training_for_gpu writes for some GPU.
_FIXED_OWNED: tuple[tuple[str, ...], ...] = (
    ("serviceAccount", "create"), ("serviceAccount", "name"), ("serviceAccount", "gcpServiceAccount"),
    ("hfToken", "existingSecret"), ("hfToken", "secretKey"),
    ("storage", "bucket"), ("storage", "prefix"),
    ("workers", "replicas"), ("workers", "gpusPerNode"), ("workers", "accelerator"), ("workers", "resources"),
    ("capacity", "type"), ("capacity", "reservation"),
    DEPENDENCIES, IMAGE_REPOSITORY, IMAGE_TAG,
)


def owned_paths() -> tuple[tuple[str, ...], ...]:
    paths = list(_FIXED_OWNED)
    for cell in fits.table().cells:
        for accelerator in next(g.accelerators for g in fits.table().gpus if g.name == cell.gpu):
            if cell.fits:
                paths += [v.path for v in training_for_gpu(accelerator, cell.size) if v.path not in paths]
    return tuple(paths)


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
        "Values for the gemma3-ray chart, written by `gemma3-ray values` (re-running it rewrites the keys it owns, keeps the rest).",
        f"project {dep.project}, region {dep.region}" + (f", cluster {dep.cluster}" if dep.cluster else "")
        + (f", namespace {dep.namespace}" if dep.namespace else ""),
    ]
    if origin:
        lines.append("from " + "; ".join(origin))
    lines.append(f"{HEADER_LAST} {dep.release} charts/gemma3-ray -n {dep.namespace} -f THIS_FILE")
    return "\n".join(lines)


HEADER_FIRST = "# Values for the gemma3-ray chart, written by"
HEADER_LAST = "install: helm upgrade --install"


def _replace_header(doc: CommentedMap, dep: Deployment) -> bool:
    """Rewrite the header an earlier run wrote (its flags and names may have changed); False if none."""
    tokens = (doc.ca.comment or [None, None])[1] or []
    if not tokens or not tokens[0].value.startswith(HEADER_FIRST):
        return False
    end = next((i for i, t in enumerate(tokens) if t.value.startswith("# " + HEADER_LAST)), None)
    if end is None:
        return False
    rest = tokens[end + 1:]
    doc.yaml_set_start_comment(header(dep))
    doc.ca.comment[1].extend(rest)
    return True


# --- comments that travel with the keys they belong to --------------------------------------------
# ruamel.yaml stores the comment lines *after* a key (before the next one) in that key's end-of-line
# token (for a mapping value: in its last leaf's). Removing or re-commenting a key must move them on.

def _eol(node: CommentedMap, key: Any) -> CommentToken | None:
    items = node.ca.items.get(key)
    return items[2] if items and len(items) > 2 else None  # noqa: PLR2004 - ruamel's EOL slot


def _leaf(node: CommentedMap, key: Any) -> tuple[CommentedMap, Any]:
    value = node[key]
    while isinstance(value, CommentedMap) and len(value):
        node, key = value, list(value)[-1]
        value = node[key]
    return node, key


def _trailing(node: CommentedMap, key: Any) -> str:
    tok = _eol(*_leaf(node, key))
    return tok.value.split("\n", 1)[1] if tok is not None and "\n" in tok.value else ""


def _append_trailing(node: CommentedMap, key: Any, text: str) -> None:
    leaf, leaf_key = _leaf(node, key)
    tok = _eol(leaf, leaf_key)
    if tok is None:
        leaf.ca.items.setdefault(leaf_key, [None, None, None, None])[2] = CommentToken("\n" + text, CommentMark(0), None)
    else:
        tok.value = (tok.value if tok.value.endswith("\n") else tok.value + "\n") + text


def _line_width(key: Any, value: Any, indent: int) -> int:
    """The width of ``key: value`` as dumped (its first line), to put the comment two spaces after it."""
    buf = io.StringIO()
    _yaml().dump(CommentedMap([(key, CommentedMap() if isinstance(value, CommentedMap) else value)]), buf)
    return indent + len(buf.getvalue().splitlines()[0].removesuffix(" {}"))


def _set_comment(node: CommentedMap, key: Any, comment: str, indent: int) -> None:
    """The plugin's end-of-line comment on its key, keeping the lines after it (the user's)."""
    keep = "" if isinstance(node[key], CommentedMap) and len(node[key]) else _trailing(node, key)
    node.yaml_add_eol_comment(comment, key, column=_line_width(key, node[key], indent) + 2)
    if keep:
        tok = node.ca.items[key][2]
        tok.value = tok.value.rstrip("\n") + "\n" + keep


def _delete(node: CommentedMap, key: Any, carried: str = "") -> str:
    """Remove a key with its own comments; the comment lines after it (and ``carried``, those after
    its removed children) move to the key before it. Returns them if the map became empty, for the
    caller to re-home one level up."""
    keys = list(node)
    at = keys.index(key)
    text = _trailing(node, key) + carried
    del node[key]
    node.ca.items.pop(key, None)
    if not text:
        return ""
    if at > 0:
        _append_trailing(node, keys[at - 1], text)
        return ""
    if len(node):
        first = list(node)[0]
        lines = [ln.strip().removeprefix("#").strip() for ln in text.splitlines() if ln.strip()]
        node.yaml_set_comment_before_after_key(first, before="\n".join(lines), indent=_indent(text))
        return ""
    return text


def _indent(text: str) -> int:
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return len(line) - len(line.lstrip())


def _remove(doc: CommentedMap, path: tuple[str, ...]) -> None:
    """Remove ``path`` and every map on it that becomes empty (a bare key renders as null)."""
    chain = [doc]
    for key in path[:-1]:
        child = chain[-1].get(key)
        if not isinstance(child, CommentedMap):
            return
        chain.append(child)
    if path[-1] not in chain[-1]:
        return
    text = _delete(chain[-1], path[-1])
    for depth in range(len(path) - 2, -1, -1):
        parent, key = chain[depth], path[depth]
        if len(parent[key]):
            if text:  # the emptied level still holds keys: the comments go after its last one
                _append_trailing(parent, key, text)
            return
        text = _delete(parent, key, text)


def _set(doc: CommentedMap, item: Value) -> None:
    node = doc
    for key in item.path[:-1]:
        child = node.get(key)
        if not isinstance(child, CommentedMap):
            child = CommentedMap()
            node[key] = child
        node = child
    key = item.path[-1]
    if key in node and isinstance(node[key], CommentedMap) and not isinstance(item.value, CommentedMap):
        _delete(node, key)
    if isinstance(item.value, CommentedMap) and isinstance(node.get(key), CommentedMap):
        keep = _trailing(node, key)
        node[key] = item.value
        if keep:
            _append_trailing(node, key, keep)
    else:
        node[key] = item.value
    _set_comment(node, key, item.comment, indent=2 * (len(item.path) - 1))


def load(path: Path) -> CommentedMap:
    try:
        doc = _yaml().load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return CommentedMap()
    except Exception as exc:
        raise ConfigError(f"Cannot parse {shown(path)} as YAML: {exc}; fix it or write to a new file.") from exc
    if doc is None:
        return CommentedMap()
    if not isinstance(doc, CommentedMap):
        raise ConfigError(f"{shown(path)} is not a YAML mapping; write the values to a new file instead.")
    return doc


def load_plain(path: Path) -> dict[str, Any]:
    """A values file as plain dicts and lists (what helm, pyhelm3 and the schema checks take)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"No values file {shown(path)}: check the path.") from exc
    return parse_plain(text, path)


def load_values(paths: Iterable[Path]) -> dict[str, Any]:
    """Several values files as the one set Helm installs from them (``helm -f a -f b``)."""
    return merged([load_plain(p) for p in paths])


def merged(layers: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Values merged as Helm merges its ``-f`` files: maps key by key, anything else from the later file."""
    out: dict[str, Any] = {}
    for layer in layers:
        out = _merge(out, layer)
    return out


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_plain(text: str, path: Path) -> dict[str, Any]:
    try:
        doc = YAML(typ="safe", pure=True).load(text)
    except Exception as exc:
        raise ConfigError(f"Cannot parse {shown(path)} as YAML: {exc}; fix it.") from exc
    if not isinstance(doc, dict | type(None)):
        raise ConfigError(f"{shown(path)} is not a YAML mapping; fix it.")
    return doc or {}


def render(dep: Deployment, existing: CommentedMap | None = None, extra: Iterable[Value] = (), size: str = "4b") -> str:
    """The values YAML: a fresh document, or ``existing`` updated in place (its other content kept)."""
    fresh = existing is None or len(existing) == 0
    doc = CommentedMap() if existing is None else existing
    items = [*owned_values(dep, size), *extra]
    produced = {item.path for item in items}
    for path in owned_paths():
        if path not in produced:
            _remove(doc, path)
    for item in items:
        _set(doc, item)
    if fresh:
        doc.yaml_set_start_comment(header(dep))
    else:
        _replace_header(doc, dep)
    buf = io.StringIO()
    _yaml().dump(doc, buf)
    return buf.getvalue()
