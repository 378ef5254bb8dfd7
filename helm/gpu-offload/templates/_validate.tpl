{{/*
Rules between values, which JSON Schema could state but Helm would then report only as "minLength: got 0,
want 1": here each message says what is wrong and what to set. Included by configmap.yaml (always rendered).
*/}}
{{- define "gpu-offload.validate" -}}
{{- if and (not .Values.hub.serviceAccount.create) (not .Values.hub.serviceAccount.name) -}}
{{- fail "hub.serviceAccount.create is false but hub.serviceAccount.name is empty: name the existing account the hub pod runs as (z2jh's default is \"hub\"), or set hub.serviceAccount.create=true" -}}
{{- end -}}
{{- if and (not .Values.usageDatabase.persistence.enabled) (not .Values.usageDatabase.url) -}}
{{- fail "usageDatabase.persistence.enabled is false but usageDatabase.url is empty: without the volume, GPU usage would be lost at every hub restart. Set usageDatabase.url (an SQLAlchemy URL, e.g. postgresql://user@host/db) or set usageDatabase.persistence.enabled=true" -}}
{{- end -}}
{{- with .Values.queueing.kueue -}}
{{- if .enabled -}}
{{- $names := list -}}
{{- range .priorityClasses -}}{{- $names = append $names .name -}}{{- end -}}
{{- if not (has .defaultPriority $names) -}}
{{- fail (printf "queueing.kueue.defaultPriority=%s is not one of queueing.kueue.priorityClasses (%s): name one of them, or add it to the list" .defaultPriority (join ", " $names)) -}}
{{- end -}}
{{- $default := .defaultPriority -}}
{{- range .priorityClasses -}}
{{- if and (eq .name $default) (or .users .groups) -}}
{{- fail (printf "queueing.kueue.defaultPriority=%s is open to some users only (its users/groups), but every run that names no class gets it: drop its users and groups, or make another class the default" $default) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with .Values.metrics -}}
{{- if and .serviceMonitor.enabled (not .open) (not .serviceMonitor.tokenSecret.name) -}}
{{- fail "metrics.serviceMonitor.enabled is true but metrics.serviceMonitor.tokenSecret.name is empty: the service answers 403 to a scrape without a token. Name a Secret holding a hub API token with the read:metrics scope, or set metrics.open=true" -}}
{{- end -}}
{{- end -}}
{{- end -}}
