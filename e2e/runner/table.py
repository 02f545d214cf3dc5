"""Every stage of `make e2e` as data: its name, group, the claim it proves, its precondition and its function.

One row per stage, in the order they run. The claim is the sentence the chart README's lifecycle table
cites (tests/e2e/test_e2e_stage_table.py holds the two equal; `python -m e2e.runner.table` prints the table).
A stage's function takes the Harness and returns what it saw; it raises StageError when its claim is
false (or NotRun when it does not apply here). Adding a stage is one row here and one function in a
module of e2e/stages/ (e2e/README.md shows one).

Preconditions: `needs` names stages that must have passed in this run (a rollback needs the upgrade it
rolls back from); `requires` names what the cluster must offer, which a preflight records in
Harness.missing with the reason ("kueue": Kueue's CRDs are not served). A stage whose precondition is
unmet, that --only/--skip leave out, or that no longer fits before E2E_DEADLINE gets a row "not run"
with the reason; after a failure the rest are "not run" too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from e2e.support.deadline import CLEANUP_RESERVE_S, DEADLINE, OutOfTime
from e2e.support.errors import StageError
from e2e.support.record import PASS, Record

SETUP, FIRST, CT, DAY2, RELEASE, FLEET, SHARED = "setup", "first", "ct", "day2", "release", "fleet", "shared"
GROUPS = (SETUP, FIRST, CT, DAY2, RELEASE, FLEET, SHARED)
DEFAULT_ONLY = f"{FIRST},{CT}"


@dataclass(frozen=True)
class StageSpec:
    name: str
    group: str
    claim: str  # what the stage proves when it passes: the sentence the chart README cites
    fn: Callable[[Any], str]  # the stage: takes the Harness, returns what it saw (StageError: its claim is false)
    needs: tuple[str, ...] = ()  # stages that must have passed in this run
    requires: tuple[str, ...] = ()  # what the cluster must offer (Harness.missing names what it lacks)
    typical_s: int = 0  # measured here (2 cores, loaded): a stage is left out when less time than this is left


def _f(module: str, name: str) -> Callable[[Any], str]:
    """The stage function module.name, imported when the stage runs (the table imports nothing heavy)."""
    def call(h: Any) -> str:
        import importlib

        return getattr(importlib.import_module(f"e2e.stages.{module}"), name)(h)
    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


FIRST_RUN = ("install", "RayJob SUCCEEDED")
_SIMULATED = ("Pods on the simulated nodes never run a container (kwok marks them Running): the claim is placement "
              "by the real kube-scheduler, not training.")
STAGES: tuple[StageSpec, ...] = (
    StageSpec("cluster start", SETUP, "e2e/cluster/cluster.sh starts a one-node Kubernetes of real parts with the KubeRay "
              "operator and Kueue.", _f("setup", "cluster_start"), typical_s=60),
    StageSpec("images", SETUP, "e2e/build/image.sh builds the head and training images (images/trainer/Dockerfile).",
              _f("setup", "images"), typical_s=900),
    StageSpec("preflight", SETUP, "The cluster serves KubeRay's ray.io/v1 CRDs knowing every RayJob field the chart "
              "sets; Kueue and a cordonable worker node are recorded for the stages that need them; a killed run's "
              "leftovers are removed.", _f("setup", "check_cluster"), typical_s=10),
    StageSpec("storage and inputs", SETUP, "The storage emulator, a Deployment in the cluster, serves the tiny "
              "Gemma 3 and the sample data to the pods (with E2E_BUCKET: the run's own prefix of that bucket, no "
              "emulator).", _f("setup", "storage_and_inputs"), typical_s=40),
    # ------------------------------------------------------------------------------------------ first
    StageSpec("install", FIRST, "`helm install` with values/e2e.yaml creates the release's RayJob `<r>-r1` and "
              "its run.", _f("first_run", "install"), typical_s=10),
    StageSpec("RayJob SUCCEEDED", FIRST, "The RayJob reaches SUCCEEDED through the real KubeRay operator.",
              _f("first_run", "succeeded"), needs=("install",), typical_s=240),
    StageSpec("helm test", FIRST, "`helm test` as NOTES print it passes against the job's live head.",
              _f("first_run", "helm_test"), needs=("install",), typical_s=20),
    StageSpec("NOTES commands", FIRST, "Every command NOTES print ran as printed and showed what it promises "
              "(`-w`: the RayJob's row; `logs -f`: the run's name; port-forward on a free local port: that "
              "cluster's dashboard and Ray version; `gcloud storage ls`: the run's files), or is run by the stage "
              "named, or is listed as not run with why.", _f("first_run", "notes_commands"),
              needs=("install", "RayJob SUCCEEDED", "helm test"), typical_s=30),  # logs -f reads the job's output
    StageSpec("NOTES: finalizer line", FIRST, "The NOTES line that removes the RayJob's finalizer frees a RayJob "
              "held terminating after `helm uninstall` (on a release made for it).",
              _f("first_run", "finalizer_line"), typical_s=30),
    StageSpec("outputs in the bucket", FIRST, "The run's adapter, metrics.jsonl, summary.json (all planned steps) "
              "and report.html are in the bucket.", _f("first_run", "check_outputs"), needs=FIRST_RUN, typical_s=2),
    StageSpec("gemma3-ray status/logs", FIRST, "`gemma3-ray status` shows the RayJob SUCCEEDED and `gemma3-ray "
              "logs` the run's name.", _f("first_run", "plugin_shows"), needs=FIRST_RUN, typical_s=20),
    # ------------------------------------------------------------------------------------------ ct
    StageSpec("ct lint", CT, "`ct lint` passes with ct.yaml and every ci/ values file.",
              _f("chart_testing", "ct_lint"), typical_s=20),
    StageSpec("ct install", CT, "`ct install` installs the chart with the ci/ values a CPU node runs, `helm test` "
              "passes, and it uninstalls.", _f("chart_testing", "ct_install"), typical_s=100),
    # ------------------------------------------------------------------------------------------ day2
    StageSpec("upgrade", DAY2, "NOTES' `helm upgrade … --reuse-values --set training.learning_rate=…` makes RayJob "
              "`<r>-r2`, a new run with the new rate; `<r>-r1`, its RayCluster and pods are gone.",
              _f("day_two", "upgrade"), needs=FIRST_RUN, typical_s=460),
    StageSpec("rollback", DAY2, "NOTES' `helm rollback <r> <revision>` to revision 1 re-applies RayJob `<r>-r1`, "
              "which resumes the first run (finished: nothing trained again).", _f("day_two", "rollback"),
              needs=(*FIRST_RUN, "upgrade"), typical_s=120),
    StageSpec("upgrade + rollback at once", DAY2, "A `helm upgrade` while the job runs, rolled back at once: the "
              "rollback works, or Helm refuses it while the previous RayJob is being deleted, `gemma3-ray status` "
              "says to wait until it is gone, and after that wait the rollback works; the rolled-back RayJob "
              "resumes its run from a checkpoint and SUCCEEDS.", _f("day_two", "quick_rollback"),
              needs=("install",), typical_s=830),
    StageSpec("uninstall", DAY2, "NOTES' `helm uninstall` leaves nothing of the release (every object its manifest "
              "names, labelled or not, and the RayCluster and pods KubeRay made) within 120 s.", _f("day_two", "uninstall"),
              needs=("install",), typical_s=40),
    StageSpec("reinstall + lost worker", DAY2, "A reinstall is a fresh run; a worker pod deleted mid-training is "
              "replaced and the run resumes from a checkpoint (0 < resumed_from_step < max_steps) to SUCCEEDED, "
              "with a loss record at every logging step.", _f("day_two", "lost_worker"), needs=("uninstall",),
              typical_s=170),
    StageSpec("lost head", DAY2, "With rayJob.backoffLimit=1, a head pod deleted mid-training fails the attempt "
              "(status.failed >= 1); KubeRay retries on a new cluster, which resumes the run from a checkpoint "
              "to SUCCEEDED.", _f("day_two", "lost_head"), needs=("install",), typical_s=220),
    StageSpec("elastic", DAY2, "With training.min_workers=1, a worker lost on a cordoned node leaves its "
              "replacement Pending and the run finishes on fewer workers with the same global batch.",
              _f("day_two", "elastic"), needs=("install",), requires=("cordonable node",), typical_s=240),
    StageSpec("kueue setup", DAY2, "`gemma3-ray kueue setup --apply` makes a ClusterQueue with quota for exactly "
              "one job, the LocalQueue and the WorkloadPriorityClass the values name.",
              _f("shared_cluster", "kueue_setup"), requires=("kueue",), typical_s=5),
    StageSpec("kueue: A admitted", DAY2, "Release A with values/shared-cluster.yaml in a namespace enforcing "
              "`restricted` is admitted by Kueue and its pods are created.", _f("shared_cluster", "a_admitted"),
              needs=("kueue setup",), requires=("kueue",), typical_s=60),
    StageSpec("restricted pods", DAY2, "Every container of A's cluster runs with a read-only root filesystem, "
              "non-root, without privilege escalation.", _f("shared_cluster", "restricted_pods"),
              needs=("kueue: A admitted",), requires=("kueue",), typical_s=5),
    StageSpec("kueue: B waits", DAY2, "Release B in the same queue waits for quota, with Kueue's own reason in "
              "`gemma3-ray status`.", _f("shared_cluster", "b_waits"), needs=("kueue: A admitted",),
              requires=("kueue",), typical_s=20),
    StageSpec("kueue: A SUCCEEDED", DAY2, "A's RayJob SUCCEEDED.", _f("shared_cluster", "a_succeeded"),
              needs=("kueue: A admitted",), requires=("kueue",), typical_s=100),
    StageSpec("kueue: B admitted after A", DAY2, "B is admitted once A's quota is free and SUCCEEDS on all its "
              "workers.", _f("shared_cluster", "b_after_a"), needs=("kueue: B waits",), requires=("kueue",),
              typical_s=120),
    StageSpec("kueue: second team", DAY2, "`kueue setup` for a second namespace exits 0 and makes that team its "
              "own ClusterQueue, leaving the first team's as it was.", _f("shared_cluster", "second_team"),
              needs=("kueue setup",), requires=("kueue",), typical_s=5),
    StageSpec("deletion rules", DAY2, "With rayJob.deletion (KubeRay >= 1.6: workers at once, the cluster after 60 s) "
              "the RayJob SUCCEEDS, its worker pods go while the head stays, the head goes no sooner than 60 s after "
              "the job's end, then no RayCluster and no pod is left and the RayJob stays.",
              _f("kuberay", "deletion_rules"), requires=("KubeRay >= 1.6",), typical_s=240),
    StageSpec("capacity fallback", DAY2, "With capacity.type=fallback [reservation, flex-start], `kueue setup` "
              "makes the two flavors in that order; release A is admitted on the reservation flavor, B, with A "
              "holding its quota, on flex-start, each head pod carrying its flavor's GKE node labels, and "
              "`gemma3-ray status` names B's flavor.", _f("kuberay", "fallback"), requires=("kueue",),
              typical_s=120),
    StageSpec("streaming", DAY2, "A dataset three times a worker pod's ephemeral-storage limit, sharded into the "
              "bucket by `gemma3-ray data shard`, trains with training.streaming to SUCCEEDED, its summary showing "
              "every row of the epoch trained once.", _f("streaming", "streamed"), typical_s=600),
    # ------------------------------------------------------------------------------------------ release (opt-in)
    StageSpec("release: install by digest", RELEASE, "`gemma3-ray release --apply` packages the chart (signed by a "
              "throwaway GnuPG key when gpg is here) and pushes it to a real OCI registry (e2e/cluster/registry.sh); "
              "`helm pull --verify` checks its provenance and digest, and `helm install oci://…@sha256:…` of the "
              "digest it printed creates the release's RayJob.", _f("release", "installed_by_digest"), typical_s=40),
    StageSpec("release: SUCCEEDED", RELEASE, "The RayJob of the chart installed from the registry reaches SUCCEEDED, "
              "as the directory install does.", _f("release", "succeeded"), needs=("release: install by digest",),
              typical_s=240),
    StageSpec("release: upgrade from the previous version", RELEASE, "The newest released artifact "
              "(charts/releases/, pushed by `helm push`) installed by digest and its job RUNNING, `gemma3-ray values "
              "--check` passing values/e2e.yaml for that version, then `helm upgrade` to this chart pushed by "
              "`gemma3-ray release --apply`: as the chart README's rule says, a new RayJob and run SUCCEED, the "
              "previous version's RayJob and its cluster are gone, and the ServiceAccount is the same object.",
              _f("release", "upgrade_from_previous"), typical_s=360),
    # ------------------------------------------------------------------------------------------ fleet (opt-in, #43)
    # `make e2e ARGS="--only first,fleet"`: needs kwok beside the local cluster (e2e/build/parts.sh build kwok);
    # elsewhere each row is "not run" with the reason (e2e/stages/fleet.py).
    StageSpec("fleet: values files placed", FLEET, "Every values file whose workers want GPUs, installed as shipped "
              "on kwok-simulated GKE nodes of its pool (labels, taints, GPUs and allocatable as GKE gives them), has "
              "each worker bound to that pool, one per node, requesting the node's GPUs, and its head on a node "
              "without GPUs. " + _SIMULATED, _f("fleet", "values_files"), typical_s=300),
    StageSpec("fleet: machine families placed", FLEET, "`gemma3-ray values --machine-type M --replicas 2` of every "
              "GPU family the plugin knows places its two workers on two simulated M nodes, one each, with all their "
              "GPUs, and the head off the GPU nodes. " + _SIMULATED, _f("fleet", "machine_families"), typical_s=600),
    StageSpec("fleet: cannot fit", FLEET, "values/tutorial.yaml on a pool one node short leaves one worker Pending "
              "with the scheduler's `Insufficient nvidia.com/gpu`; on the same machines without its reservation, "
              "every worker Pending with the scheduler's node-selector reason. " + _SIMULATED,
              _f("fleet", "cannot_fit"), typical_s=150),
    StageSpec("fleet: Kueue on GPUs", FLEET, "`gemma3-ray kueue setup --apply` with capacity.type=fallback "
              "[reservation, flex-start, on-demand] makes the three GPU flavors in that order, each with one job's GPU "
              "quota; on kwok-simulated GKE pools of a3-ultragpu-8g sized to those quotas (a reservation pool, a "
              "flex-start pool, an on-demand pool), releases installed one after another are admitted by Kueue on the "
              "reservation flavor, then flex-start, then on-demand, each one's workers bound to its flavor's pool, one "
              "per node with all its GPUs, and its head off the GPU nodes; a fourth waits with Kueue's quota reason, "
              "shown by `gemma3-ray status`. Pods on the simulated nodes never run a container (kwok marks them "
              "Running): the claim is admission by the real Kueue and placement by the real kube-scheduler, not "
              "training.",
              _f("fleet_kueue", "kueue_on_gpus"), requires=("kueue",), typical_s=240),
    # ------------------------------------------------------------------------------------------ shared (opt-in, #42)
    # `make e2e ARGS="--only shared"`: the local cluster with kwok (e2e/stages/drills.py); elsewhere "not run".
    StageSpec("shared: two runs at once", SHARED, "On the local cluster made multi-node (3 simulated GPU nodes beside "
              "the real one), with another team's namespace, queues, Kueue objects, PriorityClass and a Workload Kueue "
              "admitted made first: a second `make e2e --only first` (its own cache, output and run id, through "
              "KUBECONFIG) runs beside this run's own release; both pass, the second leaves nothing, and the other "
              "team's objects are byte-for-byte as they were.", _f("drills", "two_runs"), requires=("kueue",),
              typical_s=600),
    StageSpec("shared: killed mid elastic", SHARED, "A second run named the real node (E2E_NODE), SIGKILLed once its "
              "Lease records the node's cordon; after its Lease expires, the next run names and removes what it left "
              "and the node is as it was before (labels, taints, cordon); the other team's objects are untouched.",
              _f("drills", "killed_elastic"), requires=("kueue",), typical_s=420),
    StageSpec("shared: killed mid capacity fallback", SHARED, "The same for a second run SIGKILLed once its Lease "
              "records the node labels of `capacity fallback` (reservation, flex-start): the labels the node had come "
              "back, those it had not are removed, nothing foreign touched.", _f("drills", "killed_fallback"),
              requires=("kueue",), typical_s=360),
)


class SelectionError(ValueError):
    """--only/--skip name something the table has not, or leave a stage without what it needs."""


def by_name(table: tuple[StageSpec, ...] | None = None) -> dict[str, StageSpec]:
    return {s.name: s for s in table or STAGES}


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def select(only: str, skip: str, table: tuple[StageSpec, ...] | None = None) -> dict[str, str]:
    """The reason each stage will not run ('' for those that will) from --only and --skip, which name groups or
    stages; anything else is refused with one sentence listing the valid names."""
    table = table or STAGES
    groups = [g for g in GROUPS if g != SETUP]
    stages = [s.name for s in table if s.group != SETUP]

    def expand(flag: str, text: str) -> set[str]:
        unknown = [n for n in _names(text) if n not in groups and n not in stages]
        if unknown:
            raise SelectionError(f"{flag}: {', '.join(repr(u) for u in unknown)} is neither a group nor a stage; "
                                 f"groups: {', '.join(groups)}; stages: {', '.join(stages)}")
        return {s.name for s in table if s.group != SETUP and (s.name in _names(text) or s.group in _names(text))}

    only_set, skip_set = expand("--only", only or DEFAULT_ONLY), expand("--skip", skip)
    reasons: dict[str, str] = {}
    for s in table:
        if s.group == SETUP:
            reasons[s.name] = ""
        elif s.name in skip_set:
            reasons[s.name] = "skipped (--skip)"
        elif s.name not in only_set:
            reasons[s.name] = f"not selected (--only {only or DEFAULT_ONLY})"
        else:
            reasons[s.name] = ""
    for s in table:
        if reasons[s.name]:
            continue
        lacking = [n for n in s.needs if n not in only_set and n not in skip_set]
        if lacking:
            group = by_name(table)[lacking[0]].group
            raise SelectionError(f"--only: stage {s.name!r} needs {', '.join(repr(n) for n in lacking)} (group "
                                 f"{group}), which --only leaves out: add {group} (for example --only {group},"
                                 f"{s.group})")
    return reasons


def precondition(spec: StageSpec, record: Record, missing: dict[str, str]) -> str:
    """Why the stage cannot run now ('' when it can): a needed stage did not pass, or the cluster lacks something."""
    for what in spec.requires:
        if missing.get(what):
            return f"precondition unmet: the cluster has no {what} ({missing[what]})"
    for need in spec.needs:
        if record.result(need) != PASS:
            row = record.row(need)
            how = f"{row.result}: {row.detail.splitlines()[0][:120]}" if row and row.detail else (
                row.result if row else "no row")
            return f"precondition unmet: needs stage {need!r} to pass ({how})"
    return ""


def selected(reasons: dict[str, str], table: tuple[StageSpec, ...] | None = None) -> list[str]:
    """The stages this run is asked to prove: those --only/--skip leave in (setup rows are not asked for), less
    those needing a stage the selection leaves out (`--skip upgrade`: rollback cannot run, and was not asked to)."""
    chosen: list[str] = []
    for s in table or STAGES:
        if s.group != SETUP and not reasons.get(s.name) and all(n in chosen for n in s.needs):
            chosen.append(s.name)
    return chosen


def run(h: Any, record: Record, reasons: dict[str, str], *, deadline: float | None = None,
        table: tuple[StageSpec, ...] | None = None, clock: Callable[[], float] = time.time) -> None:
    """Run the selected stages of the table in order, each in a row of the record; a StageError stops the run
    (the rest are 'not run').

    E2E_DEADLINE (`deadline`): the stages' work stops CLEANUP_RESERVE_S before it. A stage is left out ("not run:
    time") when its typical time no longer fits; a setup row when no selected stage would fit after it; every wait
    and command of a running stage is capped to the time left (support/deadline.py), and a stage the cap stops is
    "not run: time", as is every row after it."""
    table = table or STAGES
    record.selected = selected(reasons, table)
    stop = None if deadline is None else deadline - CLEANUP_RESERVE_S
    out_of_time = ""
    with DEADLINE.until(stop):
        for spec in table:
            kw = {"group": spec.group, "claim": spec.claim}
            missing = getattr(h, "missing", {}) or {}  # read at each row: the preflight row fills it
            why = reasons.get(spec.name, "") or out_of_time or _no_time(spec, record, table, stop, clock)
            why = why or precondition(spec, record, missing)
            if why:
                record.not_run(spec.name, why, **kw)
                if spec.group == SETUP and why.startswith("time:"):  # nothing after a setup row left out can run
                    out_of_time = f"time: the setup row {spec.name!r} did not fit before E2E_DEADLINE"
                continue
            try:
                with record.stage(spec.name, **kw) as st:
                    st.detail = spec.fn(h) or ""
            except OutOfTime as e:
                out_of_time = f"time: E2E_DEADLINE came during {spec.name!r} ({str(e).splitlines()[0][:120]})"


def _no_time(spec: StageSpec, record: Record, table: tuple[StageSpec, ...], stop: float | None,
             clock: Callable[[], float]) -> str:
    """'time: …' when the stage would not end before `stop` (E2E_DEADLINE less the clean-up's room), else ''. A
    setup row: when no selected stage still to run would fit after it."""
    if stop is None:
        return ""
    left = stop - clock()
    if spec.group == SETUP:
        rest = [s.typical_s for s in table if s.name in record.selected and record.row(s.name) is None]
        if rest and left >= min(rest):
            return ""
        return (f"time: {max(0, left):.0f} s left before E2E_DEADLINE (less {CLEANUP_RESERVE_S:.0f} s for the "
                f"clean-up), no selected stage fits (the shortest needs about {min(rest, default=0)} s)")
    if left >= spec.typical_s:
        return ""
    return (f"time: about {spec.typical_s} s needed, {max(0, left):.0f} s left before E2E_DEADLINE (less "
            f"{CLEANUP_RESERVE_S:.0f} s for the clean-up)")


def finish(record: Record, why: str, table: tuple[StageSpec, ...] | None = None,
           reasons: dict[str, str] | None = None) -> None:
    """A 'not run' row for every stage of the table that has none (after a failure or ^C): its own reason from
    --only/--skip when it has one, else `why`."""
    for s in table or STAGES:
        record.not_run(s.name, (reasons or {}).get(s.name) or why, group=s.group, claim=s.claim)
    settle_notes(record)


def settle_notes(record: Record) -> None:
    """Each NOTES line left to another stage: 'ran' when that stage ran it (Record.notes_line_ran) and passed, else
    'not run' with why (the stage's row, or that it passed without needing the line)."""
    ran_by = record.facts.get("notes_lines_ran_by", [])
    for entry in record.facts.get("notes_commands", []):
        stage = entry.get("stage")
        if not stage:
            continue
        row = record.row(stage)
        if row and row.result == PASS and stage in ran_by:
            entry["result"] = f"ran (stage {stage!r} passed)"
            entry.pop("why", None)
        elif row and row.result == PASS:
            entry["result"] = "not run"
            entry["why"] = f"stage {stage!r} passed without running it ({row.detail.splitlines()[0][:160]})"
        else:
            entry["result"] = "not run"
            entry["why"] = f"stage {stage!r} " + (f"{row.result}: {row.detail.splitlines()[0][:160]}" if row and
                                                  row.detail else "did not run")


def stop_reason(record: Record, interrupted: bool, error: str = "") -> str:
    """Why the stages without a row did not run: ^C, the stage that failed, or the error that stopped the run."""
    if interrupted:
        return "interrupted"
    failed = record.failed
    if failed:
        return f"stopped: stage {failed[0]!r} failed"
    return f"stopped: {error.splitlines()[0][:200]}" if error else "stopped before it"


def lifecycle_table(table: tuple[StageSpec, ...] | None = None) -> str:
    """The chart README's table of what `make e2e` proves: generated from STAGES (a test holds them equal)."""
    rows = ["| stage | group | what it proves |", "|---|---|---|"]
    rows += [f"| `{s.name}` | {s.group} | {s.claim} |" for s in table or STAGES]
    return "\n".join(rows)


def deadline_from_env(value: str | None) -> float | None:
    """E2E_DEADLINE: a Unix time (seconds) by which the last stage must end; stages that do not fit are not run."""
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise StageError(f"E2E_DEADLINE={value!r}: give a Unix time in seconds (for example "
                         "E2E_DEADLINE=$(( $(date +%s) + 80*60 )))") from None


if __name__ == "__main__":
    print(lifecycle_table())
