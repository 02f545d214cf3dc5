{{/*
The trainer's files: what the trainer ConfigMap carries, where the submitter mounts it and how each
key goes back to its path in the package.
*/}}

{{/*
Where the job submitter pod mounts the trainer ConfigMap (read-only). No Ray pod mounts it: the
submitter's `ray job submit` uploads this directory (it holds the package `trainer/`, see
gemma3-ray.trainerItemPath) as the job's runtime-env working_dir, so every job carries exactly its
revision's files to the cluster and runs them from its working directory.
*/}}
{{- define "gemma3-ray.trainerMountPath" -}}
/home/ray/trainer
{{- end -}}

{{/*
The kubelet writes a ConfigMap volume into a timestamped `..<time>/` directory, links `..data` to it and
links each item path's first part (`trainer`) into `..data/` (ConfigMap keys cannot start with ".."):
the working_dir upload skips the `..` entries, so the package holds each file once, in its folder.
*/}}
{{- define "gemma3-ray.workingDirExcludes" -}}
{{- toJson (list "..*") -}}
{{- end -}}

{{/*
The trainer files the ConfigMap carries, as JSON {key: text}: the trainer package's Python modules (its
top level and its folders at any depth: `**` crosses '/') and requirements.txt, by explicit patterns.
Never "every file in files/trainer": a chart vendored as a plain directory in another chart's charts/
is loaded without its own .helmignore, so the trainer README, notes, editor files or caches there
would ship and change the ConfigMap's hash (hidden files and __pycache__/ are skipped). ConfigMap keys
cannot hold '/': a file's key is its path in the package with '.' for '/' (`job/flags.py` ->
`job.flags.py`), and the volume's items put it back (gemma3-ray.trainerItemPath), so a path may hold
one dot only, before its extension.
*/}}
{{- define "gemma3-ray.trainerFiles" -}}
{{- $files := dict -}}
{{- range $pattern := list "files/trainer/**.py" "files/trainer/requirements.txt" -}}
{{- range $path, $bytes := $.Files.Glob $pattern -}}
{{- $rel := trimPrefix "files/trainer/" $path -}}
{{- if not (regexMatch "(^|/)([.]|__pycache__/)" $rel) -}}
{{- if regexMatch "[.].*[.]" $rel -}}
{{- fail (printf "files/trainer/%s: a trainer file's path holds one dot, before its extension (its ConfigMap key maps folders to dots): rename the file or folder" $rel) -}}
{{- end -}}
{{- $_ := set $files (replace "/" "." $rel) (toString $bytes) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/*
The trainer package's folder in the job's working directory: the entrypoint runs
`python -m <it>.vision_train` there, and Ray puts the working directory on the workers' PYTHONPATH.
*/}}
{{- define "gemma3-ray.trainerPackage" -}}
trainer
{{- end -}}

{{/* Where a trainer ConfigMap key lands in the mounted volume: `job.flags.py` -> `trainer/job/flags.py`. */}}
{{- define "gemma3-ray.trainerItemPath" -}}
{{- $ext := regexFind "[.][^.]*$" .key -}}
{{- printf "%s/%s%s" (include "gemma3-ray.trainerPackage" .root) (replace "." "/" (trimSuffix $ext .key)) $ext -}}
{{- end -}}

{{/* The trainer ConfigMap name carries a hash of the files' names and contents. */}}
{{- define "gemma3-ray.trainerConfigMapName" -}}
{{- $acc := list -}}
{{- $files := include "gemma3-ray.trainerFiles" . | fromJson -}}
{{- range $name := keys $files | sortAlpha -}}
{{- $acc = append $acc (printf "%s\n%s" $name (index $files $name | sha256sum)) -}}
{{- end -}}
{{- printf "%s-trainer-%s" (include "gemma3-ray.fullname" .) (join "\n" $acc | sha256sum | trunc 10) -}}
{{- end -}}
