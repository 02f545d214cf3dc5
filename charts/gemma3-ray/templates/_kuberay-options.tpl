{{/*
KubeRay's own options that the chart derives from its values: the head's `ray start` parameters,
the RayJob's deletion rules and the RayCluster's history-server collector.
*/}}

{{/*
The head's `ray start` parameters: head.rayStartParams plus dashboard-port from
service.dashboardPort. KubeRay maps the head container's ports to its Service as given and leaves
`ray start`'s own ports to rayStartParams, so the two must name the same port.
*/}}
{{- define "gemma3-ray.headRayStartParams" -}}
{{- $p := deepCopy .Values.head.rayStartParams -}}
{{- $_ := set $p "dashboard-port" (toString (int .Values.service.dashboardPort)) -}}
{{- include "gemma3-ray.objectStoreParams" (dict "root" . "params" $p "gib" .Values.rayObjectStore.headGib) -}}
{{- toYaml $p -}}
{{- end -}}

{{/* The workers' `ray start` parameters: workers.rayStartParams plus rayObjectStore's. */}}
{{- define "gemma3-ray.workerRayStartParams" -}}
{{- $p := deepCopy .Values.workers.rayStartParams -}}
{{- include "gemma3-ray.objectStoreParams" (dict "root" . "params" $p "gib" .Values.rayObjectStore.workerGib) -}}
{{- toYaml $p -}}
{{- end -}}

{{/*
rayObjectStore as `ray start` parameters, set into "params": object-store-memory (bytes) when "gib" is
above 0, object-spilling-directory (spillPath, an emptyDir of spillSizeLimit) when spillSizeLimit is set.
*/}}
{{- define "gemma3-ray.objectStoreParams" -}}
{{- $os := .root.Values.rayObjectStore -}}
{{- if gt (int .gib) 0 -}}
{{- $_ := set .params "object-store-memory" (toString (mul (int64 .gib) 1073741824)) -}}
{{- end -}}
{{- if $os.spillSizeLimit -}}
{{- $_ := set .params "object-spilling-directory" $os.spillPath -}}
{{- end -}}
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
