{{/*
The trainer's command: the entry point and its flags, quoted for the two shells on the way to the job.
*/}}

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
