{{/*
Labels and annotations: every object's, the pods' (which KubeRay partly overwrites) and the RayJob's Kueue labels.
*/}}

{{/* The two labels that select the release's objects: app.kubernetes.io/name and instance. */}}
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

{{/* The chart's standard labels: helm.sh/chart, the selector labels, version (the Ray version), managed-by, part-of. */}}
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
