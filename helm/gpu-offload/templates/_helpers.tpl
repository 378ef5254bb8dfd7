{{/* Names shared by every template. */}}

{{- define "gpu-offload.name" -}}
{{- .Chart.Name -}}
{{- end -}}

{{/*
zero-to-jupyterhub's view of this release, to call its name templates from here: its values and the chart
name it checks (the parent-chart trick its _helpers-names.tpl documents reads the same values).
*/}}
{{- define "gpu-offload.z2jhContext" -}}
{{- toJson (dict "Values" .Values.jupyterhub "Chart" (dict "Name" "jupyterhub") "Release" (pick .Release "Name" "Namespace" "Service")) -}}
{{- end -}}

{{/*
The prefix of this chart's objects: the release name when it contains "gpu-offload", else
<release>-gpu-offload. The hub computes the same from the release name at start (release_fullname in
hub_extension/spawner/chart_hub.py), so the two must not diverge.
*/}}
{{- define "gpu-offload.fullname" -}}
{{- if contains "gpu-offload" .Release.Name -}}
{{- .Release.Name -}}
{{- else -}}
{{- printf "%s-gpu-offload" .Release.Name -}}
{{- end -}}
{{- end -}}

{{- define "gpu-offload.labels" -}}
app.kubernetes.io/name: {{ include "gpu-offload.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
gpu-offload.io/managed-by: gpu-offload
{{- end -}}

{{/* The hub pod's account: zero-to-jupyterhub's (jupyterhub.hub.serviceAccount). */}}
{{- define "gpu-offload.hubServiceAccount" -}}
{{- $z2jh := include "gpu-offload.z2jhContext" . | fromJson -}}
{{- include "jupyterhub.hub-serviceaccount.fullname" $z2jh -}}
{{- end -}}

{{/* The hub's identity as the API server sees it (admission policies match on it). */}}
{{- define "gpu-offload.hubUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpu-offload.hubServiceAccount" .) -}}
{{- end -}}

{{- define "gpu-offload.hubSubject" -}}
- kind: ServiceAccount
  name: {{ include "gpu-offload.hubServiceAccount" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{- define "gpu-offload.userNamespacePrefix" -}}
{{- default (printf "%s-" .Release.Namespace) .Values.userNamespaces.prefix -}}
{{- end -}}

{{/* Fixed, not a value: the spawner hook, kubespawner and the admission policy must agree on it. */}}
{{- define "gpu-offload.userNamespaceLabel" -}}
gpu-offload.io/user-namespace
{{- end -}}

{{- define "gpu-offload.userNamespaceRole" -}}
{{- printf "%s-user-namespace" (include "gpu-offload.fullname" .) -}}
{{- end -}}

{{- define "gpu-offload.userServerRole" -}}
{{- printf "%s-user-server" (include "gpu-offload.fullname" .) -}}
{{- end -}}

{{- define "gpu-offload.configMap" -}}
{{- printf "%s-config" (include "gpu-offload.fullname" .) -}}
{{- end -}}
