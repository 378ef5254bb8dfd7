{{/*
Rules between values, which JSON Schema could state but Helm would then report only as "minLength: got 0,
want 1": here each message says what is wrong and what to set. Included by configmap.yaml (always rendered).
*/}}
{{- define "gpu-offload.validate" -}}
{{- if and (not .Values.usageDatabase.url) (ne .Values.jupyterhub.hub.db.type "sqlite-pvc") -}}
{{- fail (printf "usageDatabase.url is empty and jupyterhub.hub.db.type is %s, so the usage database would have no volume and GPU usage would be lost at every hub restart. Set usageDatabase.url (an SQLAlchemy URL, e.g. postgresql://user@host/db) or keep jupyterhub.hub.db.type=sqlite-pvc" .Values.jupyterhub.hub.db.type) -}}
{{- end -}}
{{- $port := int .Values.service.port -}}
{{- $extra := dict -}}
{{- range .Values.jupyterhub.hub.service.extraPorts -}}{{- if eq .name "gpu-offload" -}}{{- $extra = . -}}{{- end -}}{{- end -}}
{{- if or (ne (int ($extra.port | default 0)) $port) (ne (int ($extra.targetPort | default 0)) $port) -}}
{{- fail (printf "service.port is %d but jupyterhub.hub.service.extraPorts has no entry {name: gpu-offload, port: %d, targetPort: %d}: the proxy reaches the service only through that port of the hub Service. Set both to the same number" $port $port $port) -}}
{{- end -}}
{{- if ne .Values.jupyterhub.singleuser.serviceAccountName .Values.userServer.serviceAccountName -}}
{{- fail (printf "jupyterhub.singleuser.serviceAccountName is %q but userServer.serviceAccountName is %q: users' servers must run as the account the spawner hook creates and the chart's roles name. Set both to the same name" (toString .Values.jupyterhub.singleuser.serviceAccountName) .Values.userServer.serviceAccountName) -}}
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
