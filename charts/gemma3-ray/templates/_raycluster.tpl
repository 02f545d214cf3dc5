{{/*
The one set of pod templates and the RayCluster spec. The RayCluster (persistent mode) and the
RayJob's inline rayClusterSpec (ephemeral mode) both include "gemma3-ray.rayClusterSpec", so the
two modes never drift apart. Ray pods never mount the trainer code: the job brings it (see
"gemma3-ray.runtimeEnv"), so a long-lived cluster cannot run stale files.
*/}}

{{/* Arguments: dict "root" $ "role" "head"|"worker". */}}
{{- define "gemma3-ray.podTemplate" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $isHead := eq .role "head" -}}
{{- $g := ternary $v.head $v.workers $isHead -}}
{{- $component := ternary "ray-head" "ray-worker" $isHead -}}
{{- $gpus := int $v.workers.gpusPerNode -}}
metadata:
  labels:
    {{- include "gemma3-ray.podLabels" (dict "root" $root "component" $component "extra" $g.podLabels) | nindent 4 }}
  {{- $podAnnotations := $g.podAnnotations }}
  {{- if $v.gcsFuse.enabled }}{{/* GKE injects the Cloud Storage FUSE sidecar into pods that say so */}}
  {{- $podAnnotations = merge (dict "gke-gcsfuse/volumes" "true") ($g.podAnnotations | default dict) }}
  {{- end }}
  {{- with include "gemma3-ray.annotations" (dict "root" $root "extra" $podAnnotations) }}
  annotations:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "gemma3-ray.serviceAccountName" $root | quote }}
  {{- /* Only the autoscaler sidecar (head, autoscaling on) talks to the Kubernetes API. */}}
  automountServiceAccountToken: {{ and $isHead $v.workers.autoscaling.enabled }}
  securityContext:
    {{- include "gemma3-ray.securityContext" (dict "root" $root "role" .role "kind" "pod") | nindent 4 }}
  {{- with $g.priorityClassName }}
  priorityClassName: {{ . | quote }}
  {{- end }}
  {{- with $v.image.pullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . | quote }}
    {{- end }}
  {{- end }}
  {{- $nodeSelector := ternary $v.head.nodeSelector (include "gemma3-ray.workerNodeSelector" $root | fromJson) $isHead }}
  {{- with $nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := ternary $v.head.tolerations (include "gemma3-ray.workerTolerations" $root | fromJsonArray) $isHead }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ ternary "ray-head" "ray-worker" $isHead }}
      image: {{ include "gemma3-ray.image" (dict "root" $root "role" .role) | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy | quote }}
      {{- if $isHead }}
      ports:
        - name: gcs-server
          containerPort: 6379
          protocol: TCP
        - name: dashboard
          containerPort: {{ $v.service.dashboardPort }}
          protocol: TCP
        - name: client
          containerPort: 10001
          protocol: TCP
      {{- end }}
      env:
        - name: HF_HOME
          value: {{ printf "%s/huggingface" $v.scratch.mountPath | quote }}
        {{- if include "gemma3-ray.hfSecretName" $root }}
        - name: HF_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ include "gemma3-ray.hfSecretName" $root | quote }}
              key: {{ $v.hfToken.secretKey | quote }}
        {{- end }}
        {{- with $g.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      resources:
        {{- $res := deepCopy $g.resources }}
        {{- if and (not $isHead) (gt $gpus 0) }}
        {{- $_ := set $res "limits" (merge (dict "nvidia.com/gpu" $gpus) (default (dict) $res.limits)) }}
        {{- $_ := set $res "requests" (merge (dict "nvidia.com/gpu" $gpus) (default (dict) $res.requests)) }}
        {{- end }}
        {{- toYaml $res | nindent 8 }}
      securityContext:
        {{- include "gemma3-ray.securityContext" (dict "root" $root "role" .role "kind" "container") | nindent 8 }}
      lifecycle:
        preStop:
          exec:
            command: ["/bin/sh", "-c", "ray stop"]
      volumeMounts:
        - name: scratch
          mountPath: {{ $v.scratch.mountPath | quote }}
        {{- include "gemma3-ray.writableMounts" (dict "root" $root "role" .role) | nindent 8 }}
        {{- if and (not $isHead) $v.workers.shmSize }}
        - name: dshm
          mountPath: /dev/shm
        {{- end }}
        {{- if $v.rayObjectStore.spillSizeLimit }}
        - name: ray-spill
          mountPath: {{ $v.rayObjectStore.spillPath | quote }}
        {{- end }}
        {{- if $v.gcsFuse.enabled }}
        - name: gcs-fuse
          mountPath: {{ $v.gcsFuse.mountPath | quote }}
          readOnly: {{ $v.gcsFuse.readOnly }}
        {{- end }}
        {{- with $g.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: scratch
      {{- if $v.scratch.sizeLimit }}
      emptyDir:
        sizeLimit: {{ $v.scratch.sizeLimit | quote }}
      {{- else }}
      emptyDir: {}
      {{- end }}
    {{- include "gemma3-ray.writableVolumes" (dict "root" $root "role" .role) | nindent 4 }}
    {{- if and (not $isHead) $v.workers.shmSize }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $v.workers.shmSize | quote }}
    {{- end }}
    {{- if $v.rayObjectStore.spillSizeLimit }}
    - name: ray-spill
      emptyDir:
        sizeLimit: {{ $v.rayObjectStore.spillSizeLimit | quote }}
    {{- end }}
    {{- if $v.gcsFuse.enabled }}
    {{- include "gemma3-ray.gcsFuseVolume" $root | nindent 4 }}
    {{- end }}
    {{- with $g.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* The Cloud Storage FUSE CSI ephemeral volume (GKE's driver): the bucket, the mount options, read-only. */}}
{{- define "gemma3-ray.gcsFuseVolume" -}}
{{- $f := .Values.gcsFuse -}}
{{- $options := $f.mountOptions | default list -}}
{{- if $f.onlyDir }}{{ $options = append $options (printf "only-dir=%s" (trimSuffix "/" $f.onlyDir)) }}{{ end -}}
- name: gcs-fuse
  csi:
    driver: gcsfuse.csi.storage.gke.io
    readOnly: {{ $f.readOnly }}
    volumeAttributes:
      bucketName: {{ required "gcsFuse.enabled needs gcsFuse.bucket or storage.bucket" ($f.bucket | default .Values.storage.bucket) | quote }}
      mountOptions: {{ join "," $options | quote }}
      gcsfuseMetadataPrefetchOnMount: {{ $f.metadataPrefetchOnMount | toString | quote }}
{{- end -}}

{{- define "gemma3-ray.rayClusterSpec" -}}
{{- $v := .Values -}}
{{- $w := $v.workers -}}
rayVersion: {{ include "gemma3-ray.rayVersion" . | quote }}
{{- if $v.rayTokenAuth }}
authOptions:
  mode: token
{{- end }}
{{- with include "gemma3-ray.historyServerOptions" . }}
historyServerOptions:
  {{- . | nindent 2 }}
{{- end }}
{{- if $w.autoscaling.enabled }}
enableInTreeAutoscaling: true
autoscalerOptions:
  upscalingMode: Default
  idleTimeoutSeconds: {{ $w.autoscaling.idleTimeoutSeconds }}
  imagePullPolicy: {{ $v.image.pullPolicy | quote }}
  resources:
    {{- toYaml $w.autoscaling.resources | nindent 4 }}
  {{- /* The sidecar runs in the head pod: the head's container security context, and with a
  read-only root the head's /tmp (KubeRay mounts the shared /tmp/ray "ray-logs" volume itself). */}}
  securityContext:
    {{- include "gemma3-ray.securityContext" (dict "root" . "role" "head" "kind" "container") | nindent 4 }}
  {{- $headDirs := include "gemma3-ray.writableDirs" (dict "root" . "role" "head") | fromJson }}
  {{- if hasKey $headDirs "tmp" }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
  {{- end }}
{{- end }}
headGroupSpec:
  serviceType: ClusterIP
  rayStartParams:
    {{- include "gemma3-ray.headRayStartParams" . | nindent 4 }}
  template:
    {{- include "gemma3-ray.podTemplate" (dict "root" . "role" "head") | nindent 4 }}
workerGroupSpecs:
  - groupName: {{ $w.groupName | quote }}
    {{- if $w.autoscaling.enabled }}
    replicas: {{ $w.autoscaling.minReplicas }}
    minReplicas: {{ $w.autoscaling.minReplicas }}
    maxReplicas: {{ $w.autoscaling.maxReplicas }}
    {{- else }}
    replicas: {{ $w.replicas }}
    minReplicas: {{ $w.replicas }}
    maxReplicas: {{ $w.replicas }}
    {{- end }}
    rayStartParams:
      {{- include "gemma3-ray.workerRayStartParams" . | nindent 6 }}
    template:
      {{- include "gemma3-ray.podTemplate" (dict "root" . "role" "worker") | nindent 6 }}
{{- end -}}
