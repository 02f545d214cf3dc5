{{/*
Versions and images: the Ray version is the trainer's pin, and every image's tag follows it.
*/}}

{{/* The trainer's requirements.txt (files/trainer/requirements.txt) as text; fails when the chart lacks it. */}}
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
