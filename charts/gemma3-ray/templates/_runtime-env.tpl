{{/*
The job's runtime env (working_dir, env_vars, setup timeout) and the check on text that reaches it.
*/}}

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
Text that reaches KubeRay's submitter inside the runtime env JSON: KubeRay passes it as one
double-quoted bash word (`--runtime-env-json "<Go strconv.Quote of the JSON>"`), where bash still
expands $ and `. Arguments: dict "key" <field path> "text" <text>.
*/}}
{{- define "gemma3-ray.checkRuntimeEnvText" -}}
{{- if regexMatch "[$`]" .text -}}
{{- fail (printf "%s: the value contains $ or `, which the KubeRay submitter's shell would expand (the runtime env reaches `bash -c` inside double quotes); remove them" .key) -}}
{{- end -}}
{{- end -}}
