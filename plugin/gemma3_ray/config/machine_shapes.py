"""Machine type / reservation → the GKE accelerator label and GPUs per node.

The labels are the values GKE puts in ``cloud.google.com/gke-accelerator`` (they equal the Compute
Engine accelerator type names), see https://cloud.google.com/compute/docs/gpus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from gemma3_ray.utils import names
from gemma3_ray.utils.errors import InvalidName, MissingSetting, UserError, call_google


@dataclass(frozen=True)
class Shape:
    machine_type: str | None
    accelerator: str
    gpus_per_node: int


# Fixed-shape families: machine type → (accelerator, GPUs).
_FIXED: dict[str, tuple[str, int]] = {
    "a4x-highgpu-4g": ("nvidia-gb200", 4),
    "a4-highgpu-8g": ("nvidia-b200", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-edgegpu-8g": ("nvidia-h100-80gb", 8),
}
# The chart runs 1, 2, 4 or 8 GPUs per node (its schema's workers.gpusPerNode); shapes beyond that
# are refused at the flag, before anything is created.
GPUS_PER_NODE = (1, 2, 4, 8)
_UNSUPPORTED = {"a2-megagpu-16g": "it has 16 A100 40GB GPUs per node and the chart runs at most 8: use "
                "a2-highgpu-8g (same GPUs, 8 per node) or a2-ultragpu-8g"}
# Families whose name ends in the GPU count: prefix → accelerator.
_COUNTED = {
    "a3-highgpu-": "nvidia-h100-80gb",
    "a2-highgpu-": "nvidia-tesla-a100",
    "a2-ultragpu-": "nvidia-a100-80gb",
}
_COUNTED_RE = re.compile(r"^(?P<prefix>[a-z0-9]+-[a-z]+-)(?P<n>1|2|4|8)g$")
# G2 (NVIDIA L4) and G4 (RTX PRO 6000): vCPUs → GPUs.
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
_G4_GPUS = {48: 1, 96: 2, 192: 4, 384: 8}
_STANDARD_RE = re.compile(r"^(?P<family>g2|g4)-standard-(?P<vcpus>\d+)$")
_STANDARD = {"g2": ("nvidia-l4", _G2_GPUS), "g4": ("nvidia-rtx-pro-6000", _G4_GPUS)}

# GPU memory per accelerator label, GB (https://cloud.google.com/compute/docs/gpus).
GPU_MEMORY_GB = {
    "nvidia-gb200": 186,
    "nvidia-b200": 180,
    "nvidia-h200-141gb": 141,
    "nvidia-h100-mega-80gb": 80,
    "nvidia-h100-80gb": 80,
    "nvidia-a100-80gb": 80,
    "nvidia-tesla-a100": 40,
    "nvidia-rtx-pro-6000": 96,
    "nvidia-l4": 24,
}

# GPUs GKE offers as flex-start (Dynamic Workload Scheduler), with or without queued provisioning:
# the GPU machine series GKE's flex-start guides cover (A4, A3 Ultra, A3 Mega, A3 High/Edge, A2,
# G2; https://cloud.google.com/kubernetes-engine/docs/concepts/dws and
# https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training). The chart refuses
# capacity.type=flex-start|queued for any other accelerator (templates/validate.yaml keeps the same list).
FLEX_START_ACCELERATORS = ("nvidia-b200", "nvidia-h200-141gb", "nvidia-h100-mega-80gb", "nvidia-h100-80gb",
                           "nvidia-a100-80gb", "nvidia-tesla-a100", "nvidia-l4")
# A flex-start VM runs at most 7 days (the node pool's max run duration defaults to, and cannot exceed, it).
FLEX_START_MAX_RUN_S = 7 * 24 * 3600


def check_flex_start(accel: str, flag: str = "--accelerator") -> None:
    if accel not in FLEX_START_ACCELERATORS:
        raise InvalidName(f"{flag} {accel} is not offered as flex-start by GKE: use one of "
                          f"{', '.join(FLEX_START_ACCELERATORS)}, or leave out --capacity.")


KNOWN_MACHINE_TYPES = sorted(
    [*_FIXED, *(p + f"{n}g" for p in _COUNTED for n in (1, 2, 4, 8))]
    + [f"g2-standard-{v}" for v in _G2_GPUS]
    + [f"g4-standard-{v}" for v in _G4_GPUS]
)


# GKE accelerator labels (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus) beyond the
# ones above; --accelerator takes any of these.
_OTHER_ACCELERATORS = ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-p4")


def accelerator(value: str) -> str:
    known = sorted([*GPU_MEMORY_GB, *_OTHER_ACCELERATORS])
    if value not in known:
        from gemma3_ray.utils.tokens import shown

        raise InvalidName(f"Unknown --accelerator {shown(value)}: pass the GKE accelerator label, one of {', '.join(known)}.")
    return value


def gpus_per_node(value: int) -> int:
    if value not in GPUS_PER_NODE:
        raise InvalidName(f"Invalid --gpus-per-node {value}: the chart runs 1, 2, 4 or 8 GPUs per node; pass one of "
                          "those (the GPUs of one node of your machine type).")
    return value


def custom_shape(machine_type: str | None, accel: str, gpus: int) -> Shape:
    return Shape(machine_type, accelerator(accel), gpus_per_node(gpus))


def shape_for_machine_type(machine_type: str) -> Shape:
    names.machine_type(machine_type)
    if machine_type in _UNSUPPORTED:
        raise InvalidName(f"--machine-type {machine_type} is not supported: {_UNSUPPORTED[machine_type]}.")
    if machine_type in _FIXED:
        accel, gpus = _FIXED[machine_type]
        return Shape(machine_type, accel, gpus)
    m = _COUNTED_RE.match(machine_type)
    if m and m.group("prefix") in _COUNTED:
        return Shape(machine_type, _COUNTED[m.group("prefix")], int(m.group("n")))
    m = _STANDARD_RE.match(machine_type)
    if m:
        accel, table = _STANDARD[m.group("family")]
        gpus = table.get(int(m.group("vcpus")))
        if gpus:
            return Shape(machine_type, accel, gpus)
    raise InvalidName(
        f"Unknown GPU machine type {machine_type!r}: use one of a4-highgpu-8g, a3-ultragpu-8g, a3-megagpu-8g, "
        "a3-highgpu-Ng, a2-highgpu-Ng, a2-ultragpu-Ng, g2-standard-N or g4-standard-N, or pass --accelerator "
        "and --gpus-per-node."
    )


class ReservationsClient(Protocol):
    """The part of ``google.cloud.compute_v1.ReservationsClient`` used here."""

    def get(self, *, project: str, zone: str, reservation: str) -> Any: ...


def check_reservation_lookup(zone: str | None, reservation: str) -> None:
    """What reading a reservation needs, checked before any credentials are looked for."""
    _, name = names.reservation(reservation)
    if not zone:
        raise MissingSetting(
            f"--reservation {name} is read through the Compute API in its zone: pass --zone (e.g. --zone "
            "us-central1-a) or run `gcloud config set compute/zone ZONE`; or pass --machine-type to skip the lookup."
        )
    names.zone(zone)


def shape_for_reservation(client: ReservationsClient, project: str, zone: str | None, reservation: str) -> Shape:
    """The shape a (specific) reservation reserves, read through the Compute API."""
    check_reservation_lookup(zone, reservation)
    owner, name = names.reservation(reservation)
    assert zone is not None  # noqa: S101 - checked above
    where = f"projects/{owner or project}/zones/{zone}/reservations/{name}"
    try:
        res = call_google("read reservation", where, lambda: client.get(project=owner or project, zone=zone,
                                                                          reservation=name))
    except UserError as err:
        if type(err) is UserError:  # unreachable API and the like: say how to go on offline
            raise UserError(f"{err} Pass --machine-type to skip the reservation lookup.") from err
        raise
    props = res.specific_reservation.instance_properties
    if props.machine_type in _UNSUPPORTED:
        raise InvalidName(f"Reservation {name!r} reserves {props.machine_type}: {_UNSUPPORTED[props.machine_type]}.")
    if props.machine_type:
        try:
            return shape_for_machine_type(props.machine_type)
        except InvalidName:
            pass
    for accel in props.guest_accelerators:
        if accel.accelerator_count:
            return custom_shape(props.machine_type or None, accel.accelerator_type, int(accel.accelerator_count))
    raise UserError(
        f"Reservation {name!r} reserves no GPU machine this tool knows ({props.machine_type or 'no machine type'}); "
        "pass --machine-type or --accelerator and --gpus-per-node."
    )


# vCPUs and memory (GB) per machine type (https://cloud.google.com/compute/docs/gpus).
_NODE_SIZE: dict[str, tuple[int, int]] = {
    "a4x-highgpu-4g": (140, 884),
    "a4-highgpu-8g": (224, 3968),
    "a3-ultragpu-8g": (224, 2952),
    "a3-megagpu-8g": (208, 1872),
    "a3-edgegpu-8g": (208, 1872),
    "a3-highgpu-1g": (26, 234),
    "a3-highgpu-2g": (52, 468),
    "a3-highgpu-4g": (104, 936),
    "a3-highgpu-8g": (208, 1872),
    "a2-highgpu-1g": (12, 85),
    "a2-highgpu-2g": (24, 170),
    "a2-highgpu-4g": (48, 340),
    "a2-highgpu-8g": (96, 680),
    "a2-megagpu-16g": (96, 1360),
    "a2-ultragpu-1g": (12, 170),
    "a2-ultragpu-2g": (24, 340),
    "a2-ultragpu-4g": (48, 680),
    "a2-ultragpu-8g": (96, 1360),
}
_GB_PER_VCPU = {"g2": 4.0, "g4": 3.75}
# The share of a node's vCPUs and memory one worker pod requests: the rest stays for the kubelet,
# GKE's system daemons and the GPU driver/device-plugin pods, so the pod always fits on the node.
WORKER_SHARE_OF_NODE = 0.75


def node_size(machine_type: str) -> tuple[int, int] | None:
    if machine_type in _NODE_SIZE:
        return _NODE_SIZE[machine_type]
    m = _STANDARD_RE.match(machine_type)
    if m:
        vcpus = int(m.group("vcpus"))
        return vcpus, int(vcpus * _GB_PER_VCPU[m.group("family")])
    return None


def node_resources(shape: Shape) -> tuple[int, str] | None:
    """(CPU, memory) requests for one worker pod on a node of this shape, or None if the size is unknown."""
    size = node_size(shape.machine_type) if shape.machine_type else None
    if size is None:
        return None
    vcpus, memory_gb = size
    return int(vcpus * WORKER_SHARE_OF_NODE), f"{int(memory_gb * WORKER_SHARE_OF_NODE)}Gi"
