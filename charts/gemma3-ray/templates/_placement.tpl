{{/*
Placement of the worker pods: the capacity type's node selector (reservation, spot, flex-start,
queued) and tolerations.
*/}}

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

{{/* The project "P" of "projects/P/reservations/N...", else empty (the reservation is in the cluster's own project). */}}
{{- define "gemma3-ray.reservationProject" -}}
{{- if hasPrefix "projects/" .Values.capacity.reservation -}}
{{- index (splitList "/" .Values.capacity.reservation) 1 -}}
{{- end -}}
{{- end -}}

{{/* The worker pods' nodeSelector as JSON: workers.nodeSelector with the chart's GKE labels laid over it (accelerator, driver version, the capacity type's). */}}
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

{{/* The worker pods' tolerations as JSON: the GPU, spot and queued-provisioning taints the chart's node selector leads to, then workers.tolerations. */}}
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
