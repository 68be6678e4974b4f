{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "batchfill.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name when it already contains the chart name. */}}
{{- define "batchfill.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "batchfill.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "batchfill.selectorLabels" -}}
app.kubernetes.io/name: {{ include "batchfill.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "batchfill.labels" -}}
helm.sh/chart: {{ include "batchfill.chart" . }}
{{ include "batchfill.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: batchfill
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "batchfill.serviceAccountName" -}}
{{- default (include "batchfill.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "batchfill.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
How the operator watches namespaces, from .Values.watchNamespaces:
  all      (empty list)        cluster-wide: everything in one ClusterRole
  names    (exact names only)  a Role per namespace + a ClusterRole with the cluster-scoped read
  patterns (any kopf glob)     cluster-wide rules, plus namespaces list/watch for kopf to follow the globs
*/}}
{{- define "batchfill.watchMode" -}}
{{- $mode := "all" }}
{{- range .Values.watchNamespaces }}
{{- if regexMatch "[*?!]" . }}
{{- $mode = "patterns" }}
{{- else if eq $mode "all" }}
{{- $mode = "names" }}
{{- end }}
{{- end }}
{{- $mode }}
{{- end }}

{{/*
RBAC rules on namespaced resources: exactly the API calls the operator makes (batchfill.adapters.kube,
batchfill.controller) and those kopf makes for it. No wildcards, no Secrets.
Server-side apply needs both create (object absent) and patch (object present).
*/}}
{{- define "batchfill.rules.namespaced" -}}
# kopf: list/watch BatchedModels; kopf and batchfill: get them; kopf: patch its progress, diff base and
# finalizer (batchfill.io/ annotations) onto them.
- apiGroups: ["batchfill.io"]
  resources: ["batchedmodels"]
  verbs: ["get", "list", "watch", "patch"]
# kopf: writes the handlers' status (conditions, plan, replica counts) through the status subresource.
- apiGroups: ["batchfill.io"]
  resources: ["batchedmodels/status"]
  verbs: ["get", "patch"]
# batchfill: the children it owns, written with server-side apply: the immutable ConfigMaps with config.pbtxt
# (one per config, named by its digest) and the Triton Service.
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# batchfill: the Triton Deployment (server-side apply).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
# batchfill: the Deployment's revisions, which own the older configs they mount (kubectl rollout undo).
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list"]
# batchfill: sets the Triton replica count through the scale subresource.
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["get", "patch"]
# batchfill: Triton pod readiness and the reasons pods stay Pending (e.g. no free nvidia.com/gpu); patch: the
# GPUPool pods' models.batchfill.io/<model> labels and annotations that route each shared model's Service
# (batchfill.controller.pool_loop, a merge patch of metadata under the pod's resourceVersion).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# batchfill: the GPUPools whose pods it loads shared models onto (read only: platform teams create them).
- apiGroups: ["batchfill.io"]
  resources: ["gpupools"]
  verbs: ["get", "list", "watch"]
# batchfill: a GPUPool's status (its pods, ready and desired pods, models, plan headroom), written by the
# pool loop through the status subresource; the spec stays the platform team's.
- apiGroups: ["batchfill.io"]
  resources: ["gpupools/status"]
  verbs: ["get", "patch"]
# kopf (kopf.event, handler errors: core v1 Events) and batchfill's decision events.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# batchfill: a ServiceMonitor per BatchedModel when prometheus-operator's CRD is served (server-side apply).
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "list", "watch", "create", "patch"]
{{- end }}

{{/* Cluster-scoped reads, needed in every mode. */}}
{{- define "batchfill.rules.clusterRead" -}}
# kopf: watches CustomResourceDefinitions to notice resources that appear or change while it runs (without
# it kopf only scans at startup and logs a warning). Read-only; discovery itself needs no rule.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}

{{/* Leader election: only in the release namespace (a Role there), never cluster-wide. */}}
{{- define "batchfill.rules.leaderElection" -}}
# batchfill: leader election (batchfill.adapters.leader) reads its Lease, creates it, and renews, takes over or
# releases it with update (a replace carrying the resourceVersion it read: optimistic concurrency).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "update"]
{{- end }}

{{/* Only for kopf namespace globs: kopf lists/watches namespaces to find those that match. */}}
{{- define "batchfill.rules.namespaces" -}}
# kopf: lists/watches namespaces to serve those matching the watchNamespaces globs.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
