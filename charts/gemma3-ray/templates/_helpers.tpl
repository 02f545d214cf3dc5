{{/* ---------------------------------------------------------------- names and labels */}}

{{- define "gemma3-ray.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/*
A name shortened to at most "max" characters without losing what told it apart: a longer name keeps
its first max-6 characters and gets "-" and 5 hex characters of the whole name's sha256, so two names
that share their first characters stay two names. Arguments: dict "name" <name> "max" <int>.
*/}}
{{- define "gemma3-ray.shorten" -}}
{{- if le (len .name) (int .max) -}}
{{- .name -}}
{{- else -}}
{{- printf "%s-%s" (regexReplaceAll "-+$" (.name | trunc (int (sub .max 6))) "") (sha256sum .name | trunc 5) -}}
{{- end -}}
{{- end -}}

{{/*
Full name: at most 40 characters so KubeRay's derived names (a RayJob's cluster gets a
"-xxxxx" suffix, its head service "-head-svc") stay within the 47/63-character limits. A longer
release-based name is shortened with a hash of the whole name (gemma3-ray.shorten): two releases
whose names share their first 40 characters never share objects.
*/}}
{{- define "gemma3-ray.fullname" -}}
{{- $name := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $name = .Values.fullnameOverride -}}
{{- else -}}
{{- $base := default .Chart.Name .Values.nameOverride -}}
{{- if contains $base .Release.Name -}}
{{- $name = .Release.Name -}}
{{- else -}}
{{- $name = printf "%s-%s" .Release.Name $base -}}
{{- end -}}
{{- end -}}
{{- $name = include "gemma3-ray.shorten" (dict "name" $name "max" 40) -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "fullnameOverride / release name: %q is not a valid KubeRay name (lowercase letters, digits and '-', starting with a letter); set fullnameOverride" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "gemma3-ray.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gemma3-ray.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gemma3-ray.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{/*
The chart's own labels of every object: commonLabels first (the schema keeps them out of the chart's
app.kubernetes.io/ and helm.sh/ keys, so none is repeated), then the standard ones.
*/}}
{{- define "gemma3-ray.labels" -}}
{{- with .Values.commonLabels }}{{ toYaml . }}{{ "\n" }}{{ end -}}
{{ include "gemma3-ray.standardLabels" . }}
{{- end -}}

{{- define "gemma3-ray.standardLabels" -}}
helm.sh/chart: {{ include "gemma3-ray.chart" . | quote }}
{{ include "gemma3-ray.selectorLabels" . }}
app.kubernetes.io/version: {{ include "gemma3-ray.rayVersion" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: gemma3-ray
{{- end -}}

{{/*
Labels of an object that has labels of its own (the RayJob: rayJob.labels and Kueue's): commonLabels,
then its own, then the chart's standard ones and the component; a later one wins on the same key.
Arguments: dict "root" $ "component" <component> "extra" <map or nil>.
*/}}
{{- define "gemma3-ray.objectLabels" -}}
{{- $l := deepCopy .root.Values.commonLabels -}}
{{- range $k, $v := .extra -}}
{{- $_ := set $l $k $v -}}
{{- end -}}
{{- range $k, $v := include "gemma3-ray.standardLabels" .root | fromYaml -}}
{{- $_ := set $l $k $v -}}
{{- end -}}
{{- $_ := set $l "app.kubernetes.io/component" .component -}}
{{- toYaml $l -}}
{{- end -}}

{{/*
metadata.annotations of an object: commonAnnotations with the object's own laid over them (those
win: Helm's hook annotations, serviceAccount.annotations, podAnnotations). Renders nothing when both
are empty, so the caller writes `annotations:` only around a non-empty result.
Arguments: dict "root" $ "extra" <map or nil>.
*/}}
{{- define "gemma3-ray.annotations" -}}
{{- $a := deepCopy .root.Values.commonAnnotations -}}
{{- range $k, $v := .extra -}}
{{- $_ := set $a $k $v -}}
{{- end -}}
{{- with $a -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* Bitnami's common.names.namespace: namespaceOverride, else the release's namespace. */}}
{{- define "gemma3-ray.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/*
Labels of pods that KubeRay creates. KubeRay overwrites app.kubernetes.io/name and
app.kubernetes.io/created-by on Ray pods, so pods are selected by instance + component only.
Arguments: dict "root" $ "component" "ray-head"|"ray-worker"|"submitter"|"test".
*/}}
{{- define "gemma3-ray.podSelectorLabels" -}}
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component | quote }}
{{- end -}}

{{/*
Every pod template's labels: commonLabels, then the group's own ("extra": head/workers.podLabels),
then the chart's (selector, part-of, chart): a later one wins on the same key.
Arguments: dict "root" $ "component" <component> ["extra" <map>].
*/}}
{{- define "gemma3-ray.podLabels" -}}
{{- $l := deepCopy .root.Values.commonLabels -}}
{{- range $k, $v := .extra -}}
{{- $_ := set $l $k $v -}}
{{- end -}}
{{- $_ := set $l "app.kubernetes.io/instance" .root.Release.Name -}}
{{- $_ := set $l "app.kubernetes.io/component" .component -}}
{{- $_ := set $l "app.kubernetes.io/part-of" "gemma3-ray" -}}
{{- $_ := set $l "helm.sh/chart" (include "gemma3-ray.chart" .root) -}}
{{- toYaml $l -}}
{{- end -}}

{{- define "gemma3-ray.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gemma3-ray.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount to use when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gemma3-ray.hfSecretName" -}}
{{- if .Values.hfToken.value -}}
{{- printf "%s-hf-token" (include "gemma3-ray.fullname" .) -}}
{{- else -}}
{{- .Values.hfToken.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "gemma3-ray.headServiceName" -}}
{{- printf "%s-head" (include "gemma3-ray.fullname" .) -}}
{{- end -}}

{{- define "gemma3-ray.clusterName" -}}
{{- include "gemma3-ray.fullname" . -}}
{{- end -}}

{{/*
The RayJob of this revision: a release resource named "<full name>-<suffix>", the suffix
"r<revision>", or rayJob.runId when set (GitOps: a name that does not depend on Helm's revision).
A new name per revision lets Helm itself create the new job and delete the old one on upgrade
(it is no longer in the manifest), delete it on uninstall and re-apply the old revision's on
rollback: no hook, so no pod is needed for any of these. KubeRay refuses RayJob names over 47
characters (ValidateRayJobMetadata: MaxRayJobNameLength = 53 - 6, its cluster's suffix) that are
not DNS-1035 labels, so the base is shortened (with a hash of the full name), never the suffix.
*/}}
{{- define "gemma3-ray.rayJobSuffix" -}}
{{- .Values.rayJob.runId | default (printf "r%d" (int .Release.Revision)) -}}
{{- end -}}

{{- define "gemma3-ray.rayJobName" -}}
{{- $suffix := include "gemma3-ray.rayJobSuffix" . -}}
{{- $base := include "gemma3-ray.shorten" (dict "name" (include "gemma3-ray.fullname" .) "max" (sub 46 (len $suffix))) -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{/*
The RayJob's own labels: rayJob.labels, then Kueue's queue-name and priority-class from kueue.*
(validate-kueue.yaml refuses those two keys in rayJob.labels). Renders nothing when all are unset.
*/}}
{{- define "gemma3-ray.kueueLabels" -}}
{{- $l := deepCopy .Values.rayJob.labels -}}
{{- with .Values.kueue.queueName -}}
{{- $_ := set $l "kueue.x-k8s.io/queue-name" . -}}
{{- end -}}
{{- with .Values.kueue.priorityClass -}}
{{- $_ := set $l "kueue.x-k8s.io/priority-class" . -}}
{{- end -}}
{{- if $l -}}
{{- toYaml $l -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- versions and images */}}

{{- define "gemma3-ray.requirements" -}}
{{- $req := .Files.Get "files/trainer/requirements.txt" -}}
{{- if not $req -}}
{{- fail "files/trainer/requirements.txt is missing from the chart: run `make sync-trainer`" -}}
{{- end -}}
{{- $req -}}
{{- end -}}

{{/* The Ray version: the `ray[...]==X` pin of the trainer's requirements (one source of truth). */}}
{{- define "gemma3-ray.rayVersion" -}}
{{- $pin := regexFind "(?m)^ray(\\[[^\\]]*\\])?==[0-9][0-9A-Za-z.+-]*" (include "gemma3-ray.requirements" .) -}}
{{- if not $pin -}}
{{- fail "files/trainer/requirements.txt has no exact ray pin (ray[...]==X.Y.Z): the cluster images are chosen from it" -}}
{{- end -}}
{{- regexReplaceAll "^.*==" $pin "" -}}
{{- end -}}

{{/*
Arguments: dict "root" $ "role" "head"|"worker"|"submitter". With dependencies=image, workers run
the training image (workers.image). The head (the driver and Ray Train's controller, which need only
Ray), the submitter (`ray job submit`) and the helm test pod run the head's own image, stock Ray by
default. The reference is [<registry>/]<repository> then @<digest> when the group sets one (a digest
wins over any tag), else :<tag>. The registry (the group's, else image.registry) is prefixed only to a
repository that names none itself: one whose first part has no "." or ":" and is not "localhost"
(the rule Docker and containerd use to tell a registry host from a Docker Hub namespace), so a
full reference such as us-docker.pkg.dev/p/r/trainer is used as given.
*/}}
{{- define "gemma3-ray.image" -}}
{{- $v := .root.Values -}}
{{- $group := ternary $v.workers $v.head (eq .role "worker") -}}
{{- $repo := default $v.image.repository $group.image.repository -}}
{{- $registry := default $v.image.registry $group.image.registry -}}
{{- $first := first (splitList "/" $repo) -}}
{{- $named := and (contains "/" $repo) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- if and $registry (not $named) -}}
{{- $repo = printf "%s/%s" $registry $repo -}}
{{- end -}}
{{- if $group.image.digest -}}
{{- printf "%s@%s" $repo $group.image.digest -}}
{{- else -}}
{{- $tag := printf "%s-%s" (include "gemma3-ray.rayVersion" .root) $v.image.pythonTag -}}
{{- if and (eq .role "worker") (gt (int $v.workers.gpusPerNode) 0) -}}
{{- $tag = printf "%s-gpu" $tag -}}
{{- end -}}
{{- printf "%s:%s" $repo (default $tag $group.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- trainer code and flags */}}

{{/*
Where the job submitter pod mounts the trainer ConfigMap (read-only). No Ray pod mounts it: the
submitter's `ray job submit` uploads this directory (it holds the package `trainer/`, see
gemma3-ray.trainerItemPath) as the job's runtime-env working_dir, so every job carries exactly its
revision's files to the cluster and runs them from its working directory.
*/}}
{{- define "gemma3-ray.trainerMountPath" -}}
/home/ray/trainer
{{- end -}}

{{/*
The kubelet writes a ConfigMap volume into a timestamped `..<time>/` directory, links `..data` to it and
links each item path's first part (`trainer`) into `..data/` (ConfigMap keys cannot start with ".."):
the working_dir upload skips the `..` entries, so the package holds each file once, in its folder.
*/}}
{{- define "gemma3-ray.workingDirExcludes" -}}
{{- toJson (list "..*") -}}
{{- end -}}

{{/*
The trainer files the ConfigMap carries, as JSON {key: text}: the trainer package's Python modules (its
top level and its folders, at any depth: `**` crosses '/') and requirements.txt, by explicit patterns. Never "every file in
files/trainer": a chart vendored as a plain directory in another chart's charts/ is loaded without its
own .helmignore, so the trainer README, notes, editor files or caches there would ship and change the
ConfigMap's hash (hidden files and __pycache__/ are skipped). ConfigMap keys cannot hold '/': a file's key is its path in the package with '.' for
'/' (`job/flags.py` -> `job.flags.py`), and the volume's items put it back (gemma3-ray.trainerItemPath).
*/}}
{{- define "gemma3-ray.trainerFiles" -}}
{{- $files := dict -}}
{{- range $pattern := list "files/trainer/**.py" "files/trainer/requirements.txt" -}}
{{- range $path, $bytes := $.Files.Glob $pattern -}}
{{- $rel := trimPrefix "files/trainer/" $path -}}
{{- if not (regexMatch "(^|/)([.]|__pycache__/)" $rel) -}}
{{- if regexMatch "[.].*[.]" $rel -}}
{{- fail (printf "files/trainer/%s: a trainer file's path holds one dot, before its extension (its ConfigMap key maps folders to dots): rename the file or folder" $rel) -}}
{{- end -}}
{{- $_ := set $files (replace "/" "." $rel) (toString $bytes) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/*
The trainer package's folder in the job's working directory: the entrypoint runs
`python -m <it>.vision_train` there, and Ray puts the working directory on the workers' PYTHONPATH.
*/}}
{{- define "gemma3-ray.trainerPackage" -}}
trainer
{{- end -}}

{{/* Where a trainer ConfigMap key lands in the mounted volume: `job.flags.py` -> `trainer/job/flags.py`. */}}
{{- define "gemma3-ray.trainerItemPath" -}}
{{- $ext := regexFind "[.][^.]*$" .key -}}
{{- printf "%s/%s%s" (include "gemma3-ray.trainerPackage" .root) (replace "." "/" (trimSuffix $ext .key)) $ext -}}
{{- end -}}

{{/* The trainer ConfigMap name carries a hash of the files' names and contents. */}}
{{- define "gemma3-ray.trainerConfigMapName" -}}
{{- $acc := list -}}
{{- $files := include "gemma3-ray.trainerFiles" . | fromJson -}}
{{- range $name := keys $files | sortAlpha -}}
{{- $acc = append $acc (printf "%s\n%s" $name (index $files $name | sha256sum)) -}}
{{- end -}}
{{- printf "%s-trainer-%s" (include "gemma3-ray.fullname" .) (join "\n" $acc | sha256sum | trunc 10) -}}
{{- end -}}

{{/* Number of Ray Train workers per worker pod: its GPUs, or 1 on CPU-only workers. */}}
{{- define "gemma3-ray.trainWorkersPerNode" -}}
{{- $g := int .Values.workers.gpusPerNode -}}
{{- ternary $g 1 (gt $g 0) -}}
{{- end -}}

{{- define "gemma3-ray.numTrainWorkers" -}}
{{- $w := .Values.workers -}}
{{- $pods := ternary $w.autoscaling.maxReplicas $w.replicas $w.autoscaling.enabled -}}
{{- mul (int $pods) (int (include "gemma3-ray.trainWorkersPerNode" .)) -}}
{{- end -}}

{{- define "gemma3-ray.storagePath" -}}
{{- $prefix := default (printf "gemma3-ray/%s" .Release.Name) .Values.storage.prefix -}}
{{- printf "gs://%s/%s" .Values.storage.bucket $prefix -}}
{{- end -}}

{{/*
The run of this Helm revision: r<revision>-<UTC time>-<4 random characters>, or
r<revision>-<rayJob.runId> when that is set (a deterministic render for `helm template`). It is
rendered into the stored manifest, so KubeRay retries (and `helm rollback` to this revision) keep
it, and every install and upgrade gets a new one, also after an uninstall and reinstall. Made once
per render (kept in .Values under a private key) so the RayJob and NOTES name the same run.
*/}}
{{- define "gemma3-ray.runName" -}}
{{- if not (hasKey .Values "_gemma3RayRunName") -}}
{{- $id := .Values.rayJob.runId | default (printf "%s-%s" (now | date "20060102-150405" | toString) (randAlphaNum 4 | lower)) -}}
{{- $_ := set .Values "_gemma3RayRunName" (printf "r%d-%s" (int .Release.Revision) $id) -}}
{{- end -}}
{{- index .Values "_gemma3RayRunName" -}}
{{- end -}}

{{/* The run's directory: checkpoints/, final/, metrics.jsonl, summary.json, TensorBoard events. */}}
{{- define "gemma3-ray.runPath" -}}
{{- printf "%s/runs/%s" (include "gemma3-ray.storagePath" .) (include "gemma3-ray.runName" .) -}}
{{- end -}}

{{/* POSIX-shell quoting of one word: bare when safe, else single-quoted. */}}
{{- define "gemma3-ray.shellQuote" -}}
{{- if regexMatch "^[A-Za-z0-9_./:@%+=,-]+$" . -}}
{{- . -}}
{{- else -}}
{{- printf "'%s'" (replace "'" "'\"'\"'" .) -}}
{{- end -}}
{{- end -}}

{{/*
The entrypoint passes through two shells: the submitter's (which this chart's quoting handles)
and, after `ray job submit` re-joins the words with Python's list2cmdline, the job
supervisor's /bin/sh. Text that the second shell would expand or split is rejected here.
*/}}
{{- define "gemma3-ray.checkFlagText" -}}
{{- if regexMatch "[$`\\\\]" .text -}}
{{- fail (printf "training.%s: the value contains $, ` or \\, which the Ray job's shell would expand (KubeRay runs the entrypoint through a shell twice); remove them" .key) -}}
{{- end -}}
{{- if and (not (regexMatch "[ \t]" .text)) (regexMatch "['&;|<>()*?\n]" .text) -}}
{{- fail (printf "training.%s: %q has shell characters ('&;|<>()*? or a newline) and no space, so the Ray job's shell would interpret it; rephrase the value" .key .text) -}}
{{- end -}}
{{- end -}}

{{/* One flag value as text: strings verbatim, booleans true/false, numbers/maps/lists as JSON. */}}
{{- define "gemma3-ray.flagValue" -}}
{{- if kindIs "string" . -}}
{{- . -}}
{{- else if kindIs "bool" . -}}
{{- ternary "true" "false" . -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

{{/*
The trainer's argv after the script: derived flags first, then every `training:` key in
sorted order, each as one shell-quoted --key=value word.
*/}}
{{- define "gemma3-ray.trainerArgs" -}}
{{- $args := list -}}
{{- $args = append $args (printf "--num_workers=%s" (include "gemma3-ray.numTrainWorkers" .)) -}}
{{- $args = append $args (printf "--use_gpu=%s" (ternary "true" "false" (gt (int .Values.workers.gpusPerNode) 0))) -}}
{{- $args = append $args (printf "--storage_path=%s" (include "gemma3-ray.shellQuote" (include "gemma3-ray.storagePath" .))) -}}
{{- $args = append $args (printf "--run_name=%s" (include "gemma3-ray.runName" .)) -}}
{{- $args = append $args (printf "--installer=%s" (include "gemma3-ray.installer" .)) -}}
{{- with .Values.rayJob.runtimeEnv.extraPip -}}
{{- $args = append $args (printf "--extra_pip=%s" (include "gemma3-ray.shellQuote" (include "gemma3-ray.extraPipFlag" $))) -}}
{{- end -}}
{{- range $k, $v := .Values.training -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $text := include "gemma3-ray.flagValue" $v -}}
{{- include "gemma3-ray.checkFlagText" (dict "key" $k "text" $text) -}}
{{- $args = append $args (printf "--%s=%s" $k (include "gemma3-ray.shellQuote" $text)) -}}
{{- end -}}
{{- end -}}
{{- join " " $args -}}
{{- end -}}

{{/* The job's command, run in its working directory (it holds the trainer package, see trainerMountPath). */}}
{{- define "gemma3-ray.entrypoint" -}}
{{- printf "python -m %s.vision_train %s" (include "gemma3-ray.trainerPackage" .) (include "gemma3-ray.trainerArgs" .) -}}
{{- end -}}

{{/*
What the Ray Train workers install at start (the trainer's --installer): none with
dependencies=image, else rayJob.runtimeEnv.installer. The trainer gives the workers, and only them,
Ray's `uv`/`pip` runtime env field with the pins of its requirements.txt (the ConfigMap's copy of
files/trainer/requirements.txt, ray excluded) and --extra_pip; the head installs nothing.
*/}}
{{- define "gemma3-ray.installer" -}}
{{- ternary "none" .Values.rayJob.runtimeEnv.installer (eq .Values.dependencies "image") -}}
{{- end -}}

{{/*
rayJob.runtimeEnv.extraPip as the trainer's --extra_pip: a JSON list, written with a space after
"[" so that `ray job submit` (subprocess.list2cmdline) double-quotes the word for the job's /bin/sh,
where only $, ` and \ remain special: those are rejected.
*/}}
{{- define "gemma3-ray.extraPipFlag" -}}
{{- $items := list -}}
{{- range $i, $p := .Values.rayJob.runtimeEnv.extraPip -}}
{{- if regexMatch "[$`\\\\]" $p -}}
{{- fail (printf "rayJob.runtimeEnv.extraPip[%d]: the value contains $ or ` (or \\), which a shell on the way to the Ray job would expand (the requirement reaches the trainer as a flag); remove them" $i) -}}
{{- end -}}
{{- $items = append $items (toRawJson $p) -}}
{{- end -}}
{{- printf "[ %s ]" (join ", " $items) -}}
{{- end -}}

{{/*
The job's runtime env: the trainer files as working_dir, env_vars and config.setup_timeout_seconds,
for every process of the job. No installer field in either mode: with dependencies=runtimeEnv the
driver gives the packages to the Ray Train workers only (see gemma3-ray.installer); Ray merges that
into this env for them (their fields win, env_vars merge), so they keep working_dir and the timeout.
*/}}
{{- define "gemma3-ray.runtimeEnv" -}}
{{- $rt := .Values.rayJob.runtimeEnv -}}
{{- $env := dict -}}
{{- range $k, $v := $rt.envVars -}}
{{- include "gemma3-ray.checkRuntimeEnvText" (dict "key" (printf "rayJob.runtimeEnv.envVars.%s" $k) "text" (toString $v)) -}}
{{- $_ := set $env $k (toString $v) -}}
{{- end -}}
{{- $re := dict "config" (dict "setup_timeout_seconds" (int $rt.setupTimeoutSeconds)) -}}
{{- $_ := set $re "working_dir" (include "gemma3-ray.trainerMountPath" .) -}}
{{- $_ := set $re "excludes" (include "gemma3-ray.workingDirExcludes" . | fromJsonArray) -}}
{{- if $env -}}
{{- $_ := set $re "env_vars" $env -}}
{{- end -}}
{{- toYaml $re -}}
{{- end -}}

{{/*
The head's `ray start` parameters: head.rayStartParams plus dashboard-port from
service.dashboardPort. KubeRay maps the head container's ports to its Service as given and leaves
`ray start`'s own ports to rayStartParams, so the two must name the same port.
*/}}
{{- define "gemma3-ray.headRayStartParams" -}}
{{- $p := deepCopy .Values.head.rayStartParams -}}
{{- $_ := set $p "dashboard-port" (toString (int .Values.service.dashboardPort)) -}}
{{- toYaml $p -}}
{{- end -}}

{{/*
Text that reaches KubeRay's submitter inside the runtime env JSON: KubeRay passes it as one
double-quoted bash word (`--runtime-env-json "<Go strconv.Quote of the JSON>"`), where bash still
expands $ and `. Arguments: dict "key" <field path> "text" <text>.
*/}}
{{- define "gemma3-ray.checkRuntimeEnvText" -}}
{{- if regexMatch "[$`]" .text -}}
{{- fail (printf "%s: the value contains $ or `, which the KubeRay submitter's shell would expand (the runtime env reaches `bash -c` inside double quotes); remove them" .key) -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- scheduling */}}

{{/* The reservation's name part: "N" of "projects/P/reservations/N[/reservationBlocks/B]", or of "N[/reservationBlocks/B]". */}}
{{- define "gemma3-ray.reservationName" -}}
{{- regexReplaceAll "/reservationBlocks/.*$" (regexReplaceAll "^projects/[^/]+/reservations/" .Values.capacity.reservation "") "" -}}
{{- end -}}

{{/* The block part "B" of ".../reservationBlocks/B", else empty. */}}
{{- define "gemma3-ray.reservationBlock" -}}
{{- if contains "/reservationBlocks/" .Values.capacity.reservation -}}
{{- regexReplaceAll "^.*/reservationBlocks/" .Values.capacity.reservation "" -}}
{{- end -}}
{{- end -}}

{{- define "gemma3-ray.reservationProject" -}}
{{- if hasPrefix "projects/" .Values.capacity.reservation -}}
{{- index (splitList "/" .Values.capacity.reservation) 1 -}}
{{- end -}}
{{- end -}}

{{- define "gemma3-ray.workerNodeSelector" -}}
{{- $w := .Values.workers -}}
{{- $sel := dict -}}
{{- if gt (int $w.gpusPerNode) 0 -}}
{{- $_ := set $sel "cloud.google.com/gke-accelerator" $w.accelerator -}}
{{- if $w.gpuDriverVersion -}}
{{- $_ := set $sel "cloud.google.com/gke-gpu-driver-version" $w.gpuDriverVersion -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.capacity.type "reservation" -}}
{{- $_ := set $sel "cloud.google.com/reservation-name" (include "gemma3-ray.reservationName" .) -}}
{{- $_ := set $sel "cloud.google.com/reservation-affinity" "specific" -}}
{{- with include "gemma3-ray.reservationProject" . -}}
{{- $_ := set $sel "cloud.google.com/reservation-project" . -}}
{{- end -}}
{{- with include "gemma3-ray.reservationBlock" . -}}
{{- $_ := set $sel "cloud.google.com/reservation-blocks" . -}}
{{- end -}}
{{- else if eq .Values.capacity.type "spot" -}}
{{- $_ := set $sel "cloud.google.com/gke-spot" "true" -}}
{{- else if has .Values.capacity.type (list "flex-start" "queued") -}}
{{- /* GKE's flex-start node label, for flex-start VMs and for queued provisioning alike. */}}
{{- $_ := set $sel "cloud.google.com/gke-flex-start" "true" -}}
{{- end -}}
{{- toJson (merge (deepCopy $w.nodeSelector) $sel) -}}
{{- end -}}

{{- define "gemma3-ray.workerTolerations" -}}
{{- $t := list -}}
{{- if gt (int .Values.workers.gpusPerNode) 0 -}}
{{- $t = append $t (dict "key" "nvidia.com/gpu" "operator" "Exists" "effect" "NoSchedule") -}}
{{- end -}}
{{- if eq .Values.capacity.type "spot" -}}
{{- $t = append $t (dict "key" "cloud.google.com/gke-spot" "operator" "Equal" "value" "true" "effect" "NoSchedule") -}}
{{- end -}}
{{- if eq .Values.capacity.type "queued" -}}
{{- /* Queued-provisioning nodes carry this taint: only pods of an admitted ProvisioningRequest land there. */}}
{{- $t = append $t (dict "key" "cloud.google.com/gke-queued" "operator" "Equal" "value" "true" "effect" "NoSchedule") -}}
{{- end -}}
{{- toJson (concat $t .Values.workers.tolerations) -}}
{{- end -}}

{{/*
rayJob.deletion as KubeRay's deletion rules (spec.deletionStrategy.deletionRules, KubeRay >= 1.6.0):
for each way a job ends (jobStatus SUCCEEDED, jobStatus FAILED, jobDeploymentStatus Failed: the
job never ran, for example its submission failed), DeleteWorkers after workersAfterSeconds (when
set) and DeleteCluster after clusterAfterSeconds (rayJob.ttlSecondsAfterFinished when null). Every
ending deletes the cluster, as shutdownAfterJobFinishes does. Renders nothing when both are null.
*/}}
{{- define "gemma3-ray.deletionRules" -}}
{{- $d := .Values.rayJob.deletion -}}
{{- if or (not (kindIs "invalid" $d.workersAfterSeconds)) (not (kindIs "invalid" $d.clusterAfterSeconds)) -}}
{{- $cluster := ternary .Values.rayJob.ttlSecondsAfterFinished $d.clusterAfterSeconds (kindIs "invalid" $d.clusterAfterSeconds) -}}
{{- range $cond := list (dict "jobStatus" "SUCCEEDED") (dict "jobStatus" "FAILED") (dict "jobDeploymentStatus" "Failed") }}
{{- if not (kindIs "invalid" $d.workersAfterSeconds) }}
- policy: DeleteWorkers
  condition:
    {{- toYaml $cond | nindent 4 }}
    ttlSeconds: {{ int $d.workersAfterSeconds }}
{{- end }}
- policy: DeleteCluster
  condition:
    {{- toYaml $cond | nindent 4 }}
    ttlSeconds: {{ int $cluster }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
historyServer.collector as the RayCluster's historyServerOptions (KubeRay >= 1.7.0). KubeRay's
collector reads the head's dashboard at localhost:8265 unless RAY_DASHBOARD_ADDRESS says otherwise:
the chart sets it from service.dashboardPort when that differs and the values do not set it.
*/}}
{{- define "gemma3-ray.historyServerOptions" -}}
{{- $c := .Values.historyServer.collector -}}
{{- if $c.image -}}
{{- $env := list -}}
{{- $named := false -}}
{{- range $c.env -}}
{{- if eq .name "RAY_DASHBOARD_ADDRESS" -}}{{- $named = true -}}{{- end -}}
{{- $env = append $env . -}}
{{- end -}}
{{- if and (not $named) (ne (int .Values.service.dashboardPort) 8265) -}}
{{- $env = append $env (dict "name" "RAY_DASHBOARD_ADDRESS" "value" (printf "http://localhost:%d" (int .Values.service.dashboardPort))) -}}
{{- end -}}
collectorOptions:
  image: {{ $c.image | quote }}
  imagePullPolicy: {{ $c.imagePullPolicy | quote }}
  {{- with $c.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end -}}
