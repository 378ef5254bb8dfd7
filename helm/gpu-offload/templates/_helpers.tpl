{{/* Names shared by every template. */}}

{{- define "gpu-offload.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name alone when it already says what it is (the overlay assumes release gpu-offload). */}}
{{- define "gpu-offload.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpu-offload.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
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

{{- define "gpu-offload.hubServiceAccount" -}}
{{- default (printf "%s-hub" (include "gpu-offload.fullname" .)) .Values.hub.serviceAccount.name -}}
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

{{- define "gpu-offload.usageClaim" -}}
{{- printf "%s-usage-db" (include "gpu-offload.fullname" .) -}}
{{- end -}}
