{{- /*
Two policies on user namespaces, rendered by admission-policy.yaml:
1. A user namespace keeps its Pod Security level and its owner, whoever updates it (the level may only be
   made stricter; the label marking it a user namespace stays).
2. What the users' server accounts may create there: the shapes the project creates (runner pods, and the
   Jobs and headless Services distributed runs need), none of the escapes Pod Security's baseline level
   also forbids, and images from offload.allowedImages when it lists any; with queueing.kueue on, only pods
   and Jobs that wait in the namespace's LocalQueue with a configured priority class (one without the queue
   label would take GPUs past Kueue, and nothing else limits a user's share then; a Job's pods are the job
   controller's, which this policy does not judge, so the Job itself must carry the label).
*/}}
{{- /*
3. With queueing.kueue on, which priority classes each user may name: the parameter is the ConfigMap
   gpu-offload-priority-classes of the request's namespace (hub_extension/spawner/user_namespace.py writes it at each
   spawn from the classes' users and groups), one key per allowed class; users' servers cannot write it.
*/}}
{{- define "gpu-offload.userNamespacePolicies" -}}
{{- $root := .root }}
{{- $enforce := .enforce | quote }}
{{- $userLabel := .label | quote }}
{{- $owner := "gpu-offload.io/user" | quote }}
{{- /* the users' server account of any user namespace (system:serviceaccount:<prefix><user>:<account>) */}}
{{- $byServer := printf "request.userInfo.username.startsWith(%s) && request.userInfo.username.endsWith(%s)" (printf "system:serviceaccount:%s" .prefix | quote) (printf ":%s" $root.Values.userServer.serviceAccountName | quote) }}
{{- $exact := list }}
{{- $prefixes := list }}
{{- range $root.Values.offload.allowedImages }}
{{- if hasSuffix "*" . }}{{ $prefixes = append $prefixes (trimSuffix "*" .) }}{{ else }}{{ $exact = append $exact . }}{{ end }}
{{- end }}
{{- /* the pod spec of a Pod or of a Job's template, as a one-element list the checks iterate over */}}
{{- $specs := `(request.resource.resource == "pods" ? [object.spec] : request.resource.resource == "jobs" ? [object.spec.template.spec] : [])` }}
{{- $containers := `s.containers + (has(s.initContainers) ? s.initContainers : []) + (has(s.ephemeralContainers) ? s.ephemeralContainers : [])` }}
{{- /* pod spec s opts in to Liqo's virtual nodes: tolerates their NoExecute taint (by its key, or every key), or
names Liqo's RuntimeClass. User namespaces are offloaded with podOffloadingStrategy Local, so Liqo's webhook adds
neither toleration nor affinity: these are the only ways a pod there reaches a donor (spec.nodeName aside). */}}
{{- $optsIn := `((has(s.tolerations) && s.tolerations.exists(t, (!has(t.effect) || t.effect == "" || t.effect == "NoExecute") && ((has(t.key) && t.key == "virtual-node.liqo.io/not-allowed" && ((has(t.operator) && t.operator == "Exists") || (has(t.value) && t.value == "true"))) || ((!has(t.key) || t.key == "") && has(t.operator) && t.operator == "Exists")))) || (has(s.runtimeClassName) && s.runtimeClassName == "liqo"))` }}
{{- /* the placement the project writes: virtual nodes named by node selector or by required node affinity on the
chosen clusters, or, with queueing on, Kueue's admission gate (Kueue writes the admitting flavor's node labels, which
name one donor's virtual nodes, when it lifts the gate; the user's server cannot lift it past this policy), no
RuntimeClass shortcut, and the project's label on the pod (a Job's: on its template) */}}
{{- $placed := `((!has(s.runtimeClassName) || s.runtimeClassName != "liqo") && ((has(s.nodeSelector) && "liqo.io/type" in s.nodeSelector && s.nodeSelector["liqo.io/type"] == "virtual-node") || (has(s.affinity) && has(s.affinity.nodeAffinity) && has(s.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) && s.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.all(term, has(term.matchExpressions) && term.matchExpressions.exists(e, e.key == "liqo.io/remote-cluster-id" && e.operator == "In")))) || (has(s.schedulingGates) && s.schedulingGates.exists(g, g.name == "kueue.x-k8s.io/admission")))` }}
{{- $managed := `(request.resource.resource == "pods" ? (has(object.metadata.labels) && "gpu-offload.io/managed-by" in object.metadata.labels && object.metadata.labels["gpu-offload.io/managed-by"] == "gpu-offload") : (has(object.spec.template.metadata) && has(object.spec.template.metadata.labels) && "gpu-offload.io/managed-by" in object.spec.template.metadata.labels && object.spec.template.metadata.labels["gpu-offload.io/managed-by"] == "gpu-offload"))` }}
{{- /* a container that asks for a GPU (the device plugin then chooses which it sees) */}}
{{- $asksGpu := `has(c.resources) && ((has(c.resources.limits) && "nvidia.com/gpu" in c.resources.limits && string(c.resources.limits["nvidia.com/gpu"]) != "0") || (has(c.resources.requests) && "nvidia.com/gpu" in c.resources.requests && string(c.resources.requests["nvidia.com/gpu"]) != "0"))` }}
{{- $trusted := list }}
{{- range $id, $c := $root.Values.clusters }}{{ if and $c $c.trusted }}{{ $trusted = append $trusted $id }}{{ end }}{{ end }}
{{- $trustedJson := $trusted | sortAlpha | toJson }}
{{- /* a node selector term (required or preferred) that names clusters names trusted ones only */}}
{{- $termTrusted := printf `(!has(t.matchExpressions) || t.matchExpressions.all(e, e.key != "liqo.io/remote-cluster-id" || (e.operator == "In" && has(e.values) && e.values.all(v, v in %s))))` $trustedJson }}
{{- /* the pod spec names no cluster but trusted ones: in its nodeSelector and in its node affinity */}}
{{- $aimedTrusted := printf `(!has(s.nodeSelector) || !("liqo.io/remote-cluster-id" in s.nodeSelector) || s.nodeSelector["liqo.io/remote-cluster-id"] in %s) && (!has(s.affinity) || !has(s.affinity.nodeAffinity) || ((!has(s.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) || !has(s.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms) || s.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.all(t, %s)) && (!has(s.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution) || s.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution.all(p, !has(p.preference) || [p.preference].all(t, %s)))))` $trustedJson $termTrusted $termTrusted }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "gpu-offload.fullname" $root }}-user-namespace-labels
  labels:
    {{- include "gpu-offload.labels" $root | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        resources: ["namespaces"]
        operations: ["UPDATE"]
  matchConditions:
    - name: a-user-namespace
      expression: >-
        has(oldObject.metadata.labels) && {{ $userLabel }} in oldObject.metadata.labels &&
        oldObject.metadata.labels[{{ $userLabel }}] == "true"
  validations:
    - expression: >-
        has(object.metadata.labels) && {{ $userLabel }} in object.metadata.labels && object.metadata.labels[{{ $userLabel }}] == "true"
        && {{ $enforce }} in object.metadata.labels && object.metadata.labels[{{ $enforce }}] in {{ .levels | toJson }}
      messageExpression: >-
        "user namespace " + object.metadata.name + " keeps the labels {{ .label }}=true and {{ .enforce }} at one of
        {{ join ", " .levels }} (the gpu-offload chart's userNamespaces.podSecurity); to change the level for every
        user, set that value and upgrade the chart"
      reason: Forbidden
    - expression: >-
        !has(oldObject.metadata.annotations) || !({{ $owner }} in oldObject.metadata.annotations) ||
        (has(object.metadata.annotations) && {{ $owner }} in object.metadata.annotations &&
        object.metadata.annotations[{{ $owner }}] == oldObject.metadata.annotations[{{ $owner }}])
      messageExpression: >-
        "user namespace " + object.metadata.name + " keeps its gpu-offload.io/user annotation: the usage meter
        bills the runs in it to that user"
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "gpu-offload.fullname" $root }}-user-namespace-labels
  labels:
    {{- include "gpu-offload.labels" $root | nindent 4 }}
spec:
  policyName: {{ include "gpu-offload.fullname" $root }}-user-namespace-labels
  validationActions: [Deny]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "gpu-offload.fullname" $root }}-user-servers
  labels:
    {{- include "gpu-offload.labels" $root | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        resources: ["pods", "services"]
        operations: ["CREATE", "UPDATE"]
      - apiGroups: ["batch"]
        apiVersions: ["v1"]
        resources: ["jobs"]
        operations: ["CREATE", "UPDATE"]
  matchConditions:
    # the users' server account of any user namespace (system:serviceaccount:<prefix><user>:<account>)
    - name: requested-by-a-users-server
      expression: >-
        {{ $byServer }}
  validations:
    - expression: >-
        {{ $specs }}.all(s, !(has(s.hostNetwork) && s.hostNetwork) && !(has(s.hostPID) && s.hostPID) &&
        !(has(s.hostIPC) && s.hostIPC))
      message: a user's server may not create pods that share the node's network, process or IPC namespace
      reason: Forbidden
    - expression: >-
        {{ $specs }}.all(s, !has(s.volumes) || s.volumes.all(v, !has(v.hostPath)))
      message: a user's server may not create pods with hostPath volumes
      reason: Forbidden
    - expression: >-
        {{ $specs }}.all(s, ({{ $containers }}).all(c, !(has(c.securityContext) && has(c.securityContext.privileged)
        && c.securityContext.privileged) && (!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0))))
      message: a user's server may not create privileged containers or containers on host ports
      reason: Forbidden
    - expression: >-
        request.resource.resource != "pods" || !has(object.metadata.ownerReferences) ||
        size(object.metadata.ownerReferences) == 0
      message: >-
        a user's server may not create pods with ownerReferences: Kueue leaves a pod owned by a kind it manages
        (a Job) without its scheduling gate, so the pod would skip the queue and the user's GPU share; create
        the Job itself instead
      reason: Forbidden
    - expression: >-
        {{ $specs }}.all(s, !has(s.nodeName) || s.nodeName == "")
      message: >-
        a user's server may not create pods or Jobs with spec.nodeName: a pod bound by its creator skips the
        scheduler, Kueue's gate and the namespace's offloading (which clusters it may reach)
      reason: Forbidden
    - expression: >-
        {{ $specs }}.all(s, !has(s.priorityClassName) || s.priorityClassName in {{ $root.Values.userServer.allowedPriorityClasses | default list | toJson }})
      message: >-
        a user's server may not name a PriorityClass (spec.priorityClassName) other than those of the gpu-offload
        chart's userServer.allowedPriorityClasses ({{ join ", " ($root.Values.userServer.allowedPriorityClasses | default list) | default "none" }}):
        Kueue orders a pod by its PriorityClass when it has no kueue.x-k8s.io/priority-class label; use
        --priority CLASS instead
      reason: Forbidden
    - expression: >-
        {{ $specs }}.all(s, ({{ $containers }}).all(c, ({{ $asksGpu }}) ||
        ((!has(c.env) || !c.env.exists(e, e.name == "NVIDIA_VISIBLE_DEVICES")) &&
        (!has(c.envFrom) || c.envFrom.all(f, has(f.prefix) && f.prefix != "" && !"NVIDIA_VISIBLE_DEVICES".startsWith(f.prefix))))))
      message: >-
        a user's server may not set NVIDIA_VISIBLE_DEVICES in a container that asks for no nvidia.com/gpu (the
        GPU runtime would hand it GPUs nobody requested, past quota and metering), neither in env nor through
        envFrom: an envFrom of a container without a GPU needs a prefix (envFrom[].prefix, e.g. APP_)
      reason: Forbidden
    {{- if $root.Values.offload.trustedOnly }}
    - expression: >-
        {{ $specs }}.all(s, {{ $aimedTrusted }})
      message: >-
        with the gpu-offload chart's offload.trustedOnly, a pod or Job may name trusted clusters only (node
        affinity or nodeSelector on liqo.io/remote-cluster-id: {{ join ", " ($trusted | sortAlpha) | default "none: no cluster is trusted" }});
        leave the cluster out, or ask your JupyterHub admin to trust it (clusters.<id>.trusted)
      reason: Forbidden
    {{- end }}
    {{- if or $exact $prefixes }}
    - expression: >-
        {{ $specs }}.all(s, ({{ $containers }}).all(c, c.image in {{ $exact | toJson }} ||
        {{ $prefixes | toJson }}.exists(p, c.image.startsWith(p))))
      message: >-
        a user's server may only run the images the gpu-offload chart allows (offload.allowedImages:
        {{ join ", " $root.Values.offload.allowedImages }}); ask your JupyterHub admin to add the image
      reason: Forbidden
    {{- end }}
    {{- with $root.Values.queueing.kueue }}{{ if .enabled }}
    {{- $classes := list }}{{ range .priorityClasses }}{{ $classes = append $classes .name }}{{ end }}
    {{- /* a protected session's pod is raised to the protected class once it runs, which the hub adds to Kueue when the chart does
    not list it (liqo_peering/kueue.py): the kernel's, open to everyone (docs/sessions.md) */}}
    {{- if and .sessionProtection (not (has .protectedPriorityClass $classes)) }}
    {{- $classes = append $classes .protectedPriorityClass }}
    {{- end }}
    - expression: >-
        !(request.resource.resource in ["pods", "jobs"]) || (has(object.metadata.labels) &&
        "kueue.x-k8s.io/queue-name" in object.metadata.labels &&
        object.metadata.labels["kueue.x-k8s.io/queue-name"] == {{ .localQueue | quote }} &&
        (!("kueue.x-k8s.io/priority-class" in object.metadata.labels) ||
        object.metadata.labels["kueue.x-k8s.io/priority-class"] in {{ $classes | toJson }}))
      message: >-
        with queueing on, a user's server may only create pods and Jobs that wait in its LocalQueue (label
        kueue.x-k8s.io/queue-name={{ .localQueue }}) with one of the priority classes {{ join ", " $classes }}
        (label kueue.x-k8s.io/priority-class)
      reason: Forbidden
    - expression: >-
        request.resource.resource != "pods" || request.operation != "CREATE" ||
        (has(object.spec.schedulingGates) && object.spec.schedulingGates.exists(g, g.name == "kueue.x-k8s.io/admission"))
      message: >-
        with queueing on, a pod of a user's server must wait for Kueue's admission (scheduling gate
        kueue.x-k8s.io/admission, which Kueue's webhook adds to a pod with the queue label): this pod was not
        gated, so it would take GPUs past the queue; check that Kueue's pod integration is on and that its
        managedJobsNamespaceSelector selects user namespaces
      reason: Forbidden
    {{- end }}{{ end }}
    - expression: >-
        {{ $specs }}.all(s, !{{ $optsIn }} || ({{ $placed }} && {{ $managed }}))
      message: >-
        a user's server may send a pod to Liqo's virtual nodes (a toleration of virtual-node.liqo.io/not-allowed
        or of every taint, or runtimeClassName liqo) only with the placement gpu-offload writes: the label
        gpu-offload.io/managed-by=gpu-offload and a node selector or required node affinity naming the virtual
        nodes (%%gpu_offload and @gpu_offload steps do); every other pod of a user namespace stays on the
        origin's nodes, away from donors
      reason: Forbidden
    - expression: >-
        request.resource.resource != "services" || ((!has(object.spec.type) || object.spec.type == "ClusterIP") &&
        has(object.spec.clusterIP) && object.spec.clusterIP == "None" &&
        (!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0))
      message: >-
        a user's server may only create headless Services (clusterIP None, type ClusterIP): no NodePort,
        LoadBalancer or externalIPs
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "gpu-offload.fullname" $root }}-user-servers
  labels:
    {{- include "gpu-offload.labels" $root | nindent 4 }}
spec:
  policyName: {{ include "gpu-offload.fullname" $root }}-user-servers
  validationActions: [Deny]
{{- if $root.Values.queueing.kueue.enabled }}
{{- $label := "kueue.x-k8s.io/priority-class" | quote }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "gpu-offload.fullname" $root }}-priority-classes
  labels:
    {{- include "gpu-offload.labels" $root | nindent 4 }}
spec:
  failurePolicy: Fail
  paramKind:
    apiVersion: v1
    kind: ConfigMap
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        resources: ["pods"]
        operations: ["CREATE", "UPDATE"]
      - apiGroups: ["batch"]
        apiVersions: ["v1"]
        resources: ["jobs"]
        operations: ["CREATE", "UPDATE"]
  matchConditions:
    - name: requested-by-a-users-server
      expression: >-
        {{ $byServer }}
    - name: names-a-priority-class
      expression: has(object.metadata.labels) && {{ $label }} in object.metadata.labels
  validations:
    - expression: has(params.data) && object.metadata.labels[{{ $label }}] in params.data
      messageExpression: >-
        "priority class " + object.metadata.labels[{{ $label }}] + " is not one this user may use (the gpu-offload
        chart's queueing.kueue.priorityClasses: its users and groups); leave --priority out for the default
        class, or ask your JupyterHub admin"
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "gpu-offload.fullname" $root }}-priority-classes
  labels:
    {{- include "gpu-offload.labels" $root | nindent 4 }}
spec:
  policyName: {{ include "gpu-offload.fullname" $root }}-priority-classes
  validationActions: [Deny]
  # User namespaces only: the API server looks the parameter up before it evaluates the policy's match
  # conditions, so without this every pod and Job created in a namespace without the ConfigMap (the hub's own,
  # kube-system) was denied "no params found for policy binding" (seen on a real cluster: the hub pod could not
  # come back after a restart).
  matchResources:
    namespaceSelector:
      matchLabels:
        {{ include "gpu-offload.userNamespaceLabel" $root }}: "true"
  # no namespace: the ConfigMap of the request's own namespace; missing (a server started before queueing was
  # turned on) denies, and the user's next server start writes it
  paramRef:
    name: gpu-offload-priority-classes
    parameterNotFoundAction: Deny
{{- end }}
{{- end -}}
