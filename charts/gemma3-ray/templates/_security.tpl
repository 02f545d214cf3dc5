{{/* ---------------------------------------------------------------- security contexts */}}

{{/*
The values of a pod's role: head, worker, submitter (the RayJob's submitterPodTemplate) or test
(templates/tests). Each holds podSecurityContext and containerSecurityContext, laid over the global
ones by "gemma3-ray.securityContext". Arguments: dict "root" $ "role" <role>; returns JSON.
*/}}
{{- define "gemma3-ray.roleValues" -}}
{{- $v := .root.Values -}}
{{- if eq .role "head" -}}
{{- toJson $v.head -}}
{{- else if eq .role "worker" -}}
{{- toJson $v.workers -}}
{{- else if eq .role "submitter" -}}
{{- toJson (dict "podSecurityContext" $v.rayJob.submitterPodSecurityContext "containerSecurityContext" $v.rayJob.submitterContainerSecurityContext) -}}
{{- else if eq .role "test" -}}
{{- toJson $v.tests -}}
{{- else -}}
{{- fail (printf "gemma3-ray.roleValues: unknown role %q" .role) -}}
{{- end -}}
{{- end -}}

{{/*
A pod's (kind "pod") or its containers' (kind "container") security context: the global
podSecurityContext / containerSecurityContext with the role's map of the same name laid over it key
by key. A key the role sets replaces the global key whole (capabilities and seccompProfile too), so
false and 0 count; a key set to null in the global map is gone everywhere (Helm drops it).
Arguments: dict "root" $ "role" <role> "kind" "pod"|"container"; returns YAML.
*/}}
{{- define "gemma3-ray.securityContext" -}}
{{- $key := ternary "podSecurityContext" "containerSecurityContext" (eq .kind "pod") -}}
{{- $sc := deepCopy (index .root.Values $key) -}}
{{- $role := include "gemma3-ray.roleValues" (dict "root" .root "role" .role) | fromJson -}}
{{- range $k, $v := (index $role $key) -}}
{{- $_ := set $sc $k $v -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* ---------------------------------------------------------------- writable directories */}}

{{/* HOME of the Ray images' user (uid 1000, "ray"); its Python lives in $HOME/anaconda3. */}}
{{- define "gemma3-ray.rayHome" -}}
/home/ray
{{- end -}}

{{/*
The emptyDirs a role's container writes to: name -> mount path. Ray pods always get Ray's temp dir
/tmp/ray (session, logs, sockets, the job's unpacked working_dir and the runtime-env installs) as the
volume "ray-logs": the name KubeRay gives the /tmp/ray volume it shares with the autoscaler sidecar
(common/pod.go, addEmptyDir), so with autoscaling the sidecar mounts this same volume. With
readOnlyRootFilesystem true in the role's container security context, each also gets, as separate
emptyDirs:
  /tmp                       Python's tempfile (Ray's processes, uv's and pip's build and
                             --no-cache directories, the trainer's checkpoint staging, torch's
                             inductor cache), KubeRay's submitter (`ray job submit`);
  $HOME/.cache               pip, uv, torch and triton caches (HF_HOME is on the scratch volume);
  $HOME/.triton              Triton's kernel cache (~/.triton/cache: torch.compile, fused kernels);
  $HOME/.config              matplotlib's and other libraries' settings.
Submitter and test pods get /tmp only. Arguments: dict "root" $ "role" <role>; returns JSON.
*/}}
{{- define "gemma3-ray.writableDirs" -}}
{{- $dirs := dict -}}
{{- $ray := has .role (list "head" "worker") -}}
{{- if $ray -}}
{{- $_ := set $dirs "ray-logs" "/tmp/ray" -}}
{{- end -}}
{{- $sc := include "gemma3-ray.securityContext" (dict "root" .root "role" .role "kind" "container") | fromYaml -}}
{{- if $sc.readOnlyRootFilesystem -}}
{{- $_ := set $dirs "tmp" "/tmp" -}}
{{- if $ray -}}
{{- $home := include "gemma3-ray.rayHome" .root -}}
{{- $_ := set $dirs "home-cache" (printf "%s/.cache" $home) -}}
{{- $_ := set $dirs "home-triton" (printf "%s/.triton" $home) -}}
{{- $_ := set $dirs "home-config" (printf "%s/.config" $home) -}}
{{- end -}}
{{- end -}}
{{- toJson $dirs -}}
{{- end -}}

{{/* Volume names the chart uses; extraVolumes may not reuse them (validate.yaml). */}}
{{- define "gemma3-ray.reservedVolumeNames" -}}
{{- toJson (list "trainer" "scratch" "dshm" "ray-logs" "tmp" "home-cache" "home-triton" "home-config") -}}
{{- end -}}

{{/* volumeMounts entries of the writable dirs (YAML list, or nothing). Arguments: dict "root" $ "role" <role>. */}}
{{- define "gemma3-ray.writableMounts" -}}
{{- $out := list -}}
{{- range $name, $path := include "gemma3-ray.writableDirs" . | fromJson -}}
{{- $out = append $out (dict "name" $name "mountPath" $path) -}}
{{- end -}}
{{- with $out -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* volumes entries of the writable dirs, emptyDirs (YAML list, or nothing). Arguments: dict "root" $ "role" <role>. */}}
{{- define "gemma3-ray.writableVolumes" -}}
{{- $out := list -}}
{{- range $name, $_ := include "gemma3-ray.writableDirs" . | fromJson -}}
{{- $out = append $out (dict "name" $name "emptyDir" (dict)) -}}
{{- end -}}
{{- with $out -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}
