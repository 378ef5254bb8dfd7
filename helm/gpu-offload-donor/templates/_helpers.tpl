{{/* Names shared by every template: the release name when it contains "gpu-offload-donor", else <release>-gpu-offload-donor. */}}
{{- define "donor.fullname" -}}
{{- if contains "gpu-offload-donor" .Release.Name -}}
{{- .Release.Name -}}
{{- else -}}
{{- printf "%s-gpu-offload-donor" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "donor.labels" -}}
app.kubernetes.io/name: gpu-offload-donor
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "donor.selector" -}}
app.kubernetes.io/name: gpu-offload-donor
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-labeller
{{- end -}}
