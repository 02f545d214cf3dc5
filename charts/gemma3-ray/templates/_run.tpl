{{/*
The run: how many Ray Train workers, where its files go and its name.
*/}}

{{/* Number of Ray Train workers per worker pod: its GPUs, or 1 on CPU-only workers. */}}
{{- define "gemma3-ray.trainWorkersPerNode" -}}
{{- $g := int .Values.workers.gpusPerNode -}}
{{- ternary $g 1 (gt $g 0) -}}
{{- end -}}

{{/* Ray Train's num_workers: the worker pods (autoscaling.maxReplicas with autoscaling, else replicas) times the workers per pod. */}}
{{- define "gemma3-ray.numTrainWorkers" -}}
{{- $w := .Values.workers -}}
{{- $pods := ternary $w.autoscaling.maxReplicas $w.replicas $w.autoscaling.enabled -}}
{{- mul (int $pods) (int (include "gemma3-ray.trainWorkersPerNode" .)) -}}
{{- end -}}

{{/* The release's storage root: gs://<storage.bucket>/<storage.prefix, else gemma3-ray/<release name>>. */}}
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
