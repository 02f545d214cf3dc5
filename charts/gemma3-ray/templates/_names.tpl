{{/*
The names of the release's objects: the chart's, the full name, the namespace, the ServiceAccount,
the Secret, the head Service, the RayCluster and the RayJob.
*/}}

{{/* The chart's short name: nameOverride, else the chart's name (at most 40 characters). */}}
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

{{/* The helm.sh/chart label: <name>-<version>, '+' as '_', at most 63 characters. */}}
{{- define "gemma3-ray.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Bitnami's common.names.namespace: namespaceOverride, else the release's namespace. */}}
{{- define "gemma3-ray.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* The pods' ServiceAccount: serviceAccount.name, else the full name when the chart creates it; the existing one named (required) when it does not. */}}
{{- define "gemma3-ray.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gemma3-ray.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount to use when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the Hugging Face token: the chart's own (<full name>-hf-token) when hfToken.value is set, else hfToken.existingSecret (empty: none). */}}
{{- define "gemma3-ray.hfSecretName" -}}
{{- if .Values.hfToken.value -}}
{{- printf "%s-hf-token" (include "gemma3-ray.fullname" .) -}}
{{- else -}}
{{- .Values.hfToken.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The head Service's name: <full name>-head. */}}
{{- define "gemma3-ray.headServiceName" -}}
{{- printf "%s-head" (include "gemma3-ray.fullname" .) -}}
{{- end -}}

{{/* The RayCluster's name (persistent mode): the full name. */}}
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

{{/* The RayJob's name: the full name, shortened to leave room for "-<suffix>" within 47 characters, then the suffix. */}}
{{- define "gemma3-ray.rayJobName" -}}
{{- $suffix := include "gemma3-ray.rayJobSuffix" . -}}
{{- $base := include "gemma3-ray.shorten" (dict "name" (include "gemma3-ray.fullname" .) "max" (sub 46 (len $suffix))) -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}
