{{/* Names ------------------------------------------------------------------------ */}}

{{- define "rpw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Service name too, so it must be a DNS-1035 label (63 characters at most). */}}
{{- define "rpw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rpw.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rpw.serviceName" -}}
{{- include "rpw.fullname" . -}}
{{- end -}}

{{- define "rpw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rpw.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rpw.secretName" -}}
{{- default (printf "%s-tls" (include "rpw.fullname" .)) .Values.certs.secretName -}}
{{- end -}}

{{- define "rpw.mutatingName" -}}
{{- printf "%s-mutating" (include "rpw.fullname" .) -}}
{{- end -}}

{{- define "rpw.validatingName" -}}
{{- printf "%s-validating" (include "rpw.fullname" .) -}}
{{- end -}}

{{- define "rpw.certgenName" -}}
{{- printf "%s-certgen" (include "rpw.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rpw.releaseGatesName" -}}
{{- printf "%s-release-gates" (include "rpw.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rpw.certificateName" -}}
{{- include "rpw.fullname" . -}}
{{- end -}}

{{/* Labels ----------------------------------------------------------------------- */}}

{{- define "rpw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rpw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The webhook pods only: Service, PodDisruptionBudget and spread select on these. */}}
{{- define "rpw.webhookSelectorLabels" -}}
{{ include "rpw.selectorLabels" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "rpw.labels" -}}
helm.sh/chart: {{ include "rpw.chart" . }}
{{ include "rpw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: retry-policy-webhook
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Image: a digest pins it, else the tag, else the chart's appVersion. */}}
{{- define "rpw.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Webhooks ---------------------------------------------------------------------- */}}

{{/*
Namespaces sent to the webhook. kube-system and the release namespace are always
excluded: the webhook must never be able to block the control plane or its own
recovery (its pods, and the certificate Job, live in the release namespace).
*/}}
{{- define "rpw.namespaceSelector" -}}
{{- $excluded := list "kube-system" .Release.Namespace -}}
{{- range .Values.webhook.excludedNamespaces -}}
{{- $excluded = append $excluded . -}}
{{- end -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- toYaml ($excluded | uniq) | nindent 6 }}
{{- if .Values.webhook.optIn.enabled }}
  - key: {{ .Values.webhook.optIn.label | quote }}
    operator: In
    values:
      - {{ .Values.webhook.optIn.value | quote }}
{{- end }}
{{- end -}}

{{/*
Rules for the workload webhook: every enabled kind except pods. Only the main resource
is listed, so status and other subresources never reach the webhook.
Arguments: (dict "ctx" $ "operations" (list ...) ["updateOperations" (list ...)]): the
operations of the kinds whose UPDATEs the mutating webhook needs too: a CronJob is a
template for Jobs created later; a JobSet's or a TrainJob's re-apply (server-side apply by
the trainer, kubectl apply) can leave out what the webhook added at creation.
*/}}
{{- define "rpw.workloadRules" -}}
{{- $kinds := .ctx.Values.webhook.kinds -}}
{{- $rules := list -}}
{{- if $kinds.jobs -}}
{{- $rules = append $rules (dict "apiGroups" (list "batch") "apiVersions" (list "v1") "resources" (list "jobs")) -}}
{{- end -}}
{{- if $kinds.cronJobs -}}
{{- $rules = append $rules (dict "apiGroups" (list "batch") "apiVersions" (list "v1") "resources" (list "cronjobs") "operations" (.updateOperations | default .operations)) -}}
{{- end -}}
{{- if $kinds.jobSets -}}
{{- $rules = append $rules (dict "apiGroups" (list "jobset.x-k8s.io") "apiVersions" (list "v1alpha2") "resources" (list "jobsets") "operations" (.updateOperations | default .operations)) -}}
{{- end -}}
{{- if $kinds.rayJobs -}}
{{- $rules = append $rules (dict "apiGroups" (list "ray.io") "apiVersions" (list "v1") "resources" (list "rayjobs")) -}}
{{- end -}}
{{- if $kinds.pyTorchJobs -}}
{{- $rules = append $rules (dict "apiGroups" (list "kubeflow.org") "apiVersions" (list "v1") "resources" (list "pytorchjobs")) -}}
{{- end -}}
{{- if $kinds.trainJobs -}}
{{- $rules = append $rules (dict "apiGroups" (list "trainer.kubeflow.org") "apiVersions" (list "v1alpha1") "resources" (list "trainjobs") "operations" (.updateOperations | default .operations)) -}}
{{- end -}}
{{- range $rules }}
- apiGroups: {{ toJson .apiGroups }}
  apiVersions: {{ toJson .apiVersions }}
  resources: {{ toJson .resources }}
  operations: {{ toJson (.operations | default $.operations) }}
  scope: Namespaced
{{- end }}
{{- end -}}

{{- define "rpw.hasWorkloads" -}}
{{- $k := .Values.webhook.kinds -}}
{{- if or $k.jobs $k.cronJobs $k.jobSets $k.rayJobs $k.pyTorchJobs $k.trainJobs -}}true{{- end -}}
{{- end -}}

{{/*
matchConditions (CEL). The rules only ever contain CREATE and UPDATE, so `object` is
never null here (it is null only for DELETE) and `oldObject` is set exactly on UPDATE;
but for the pod deletions' webhook (below), whose rule is DELETE: there only `oldObject`.
*/}}

{{/* Mirror pods (static pods shown by the kubelet) must never be touched. */}}
{{- define "rpw.cel.notMirrorPod" -}}
!has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)
{{- end -}}

{{/* A pod is only ours when it carries a retry-policy.dev/ annotation. */}}
{{- define "rpw.cel.hasPolicyAnnotation" -}}
has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('retry-policy.dev/'))
{{- end -}}

{{/*
On UPDATE only a change to retry-policy.dev/ annotations can be denied (objects are
checked once, at CREATE), so any other update (controllers setting finalizers, Kueue
suspending a Job) skips the webhook and cannot be blocked by it. The expression is
true exactly when the set of retry-policy.dev/ keys or one of their values differs
between oldObject and object; it is true for every other operation. The controller's
own record (retry-policy.dev/history, rewritten after each failure) is no policy: its
writes never reach the webhook.
*/}}
{{- define "rpw.cel.updateChangesPolicy" -}}
request.operation != 'UPDATE' || (has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('retry-policy.dev/') && k != 'retry-policy.dev/history' && (!has(oldObject.metadata.annotations) || !(k in oldObject.metadata.annotations) || oldObject.metadata.annotations[k] != object.metadata.annotations[k]))) || (has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k, k.startsWith('retry-policy.dev/') && k != 'retry-policy.dev/history' && (!has(object.metadata.annotations) || !(k in object.metadata.annotations))))
{{- end -}}

{{/*
Workloads: the same, and also a CronJob UPDATE that changes its jobTemplate (the Jobs it
creates from then on must carry the policy, so the template is mutated and checked
again), and an UPDATE of an annotated Job, RayJob or PyTorchJob that changes its retry
budget (mutable: it must still agree with the retry-policy.dev/backoff-limit annotation,
and a Job's non-spot-attempts must still fit it). The kind tests come first: other kinds
have no such fields (a false && stops CEL before a missing field is read).
*/}}
{{- define "rpw.cel.updateChangesPolicyOrJobTemplate" -}}
{{ include "rpw.cel.updateChangesPolicy" . }} || (request.kind.kind == 'CronJob' && has(object.spec.jobTemplate) && (!has(oldObject.spec.jobTemplate) || object.spec.jobTemplate != oldObject.spec.jobTemplate)) || ({{ include "rpw.cel.hasPolicyAnnotation" . }} && ((request.kind.kind in ['Job', 'RayJob'] && (has(object.spec.backoffLimit) ? object.spec.backoffLimit : -1) != (has(oldObject.spec.backoffLimit) ? oldObject.spec.backoffLimit : -1)) || (request.kind.kind == 'PyTorchJob' && ((has(object.spec.runPolicy) && has(object.spec.runPolicy.backoffLimit)) ? object.spec.runPolicy.backoffLimit : -1) != ((has(oldObject.spec.runPolicy) && has(oldObject.spec.runPolicy.backoffLimit)) ? oldObject.spec.runPolicy.backoffLimit : -1))))
{{- end -}}

{{/*
The mutating webhook also gets the UPDATEs that can leave out what it added at creation,
to put it back (engine._restore): of a JobSet it applied the policy to
(retry-policy.dev/applied) whose spec changes (the trainer's server-side apply resets the
lists it owns whole, failurePolicy.rules among them), and of a TrainJob whose
runtimePatches lose or change the webhook's entry (a kubectl apply replaces the list).
*/}}
{{- define "rpw.cel.mutateUpdate" -}}
{{ include "rpw.cel.updateChangesPolicyOrJobTemplate" . }} || (request.kind.kind == 'JobSet' && has(oldObject.metadata.annotations) && 'retry-policy.dev/applied' in oldObject.metadata.annotations && has(object.spec) && has(oldObject.spec) && object.spec != oldObject.spec) || (request.kind.kind == 'TrainJob' && has(oldObject.spec) && has(oldObject.spec.runtimePatches) && oldObject.spec.runtimePatches.exists(p, has(p.manager) && p.manager == 'retry-policy.dev/webhook') && (!has(object.spec) || !has(object.spec.runtimePatches) || object.spec.runtimePatches != oldObject.spec.runtimePatches))
{{- end -}}

{{/*
Pods made by a controller (a Job's pods) are never denied at CREATE: the engine admits
them with a warning whatever their annotations say, since the controller could not fix
them and the workload was validated when it was created. Skipping them keeps the
fail-closed validating webhook out of the path of every Job retry.
*/}}
{{- define "rpw.cel.podCreateNotControlled" -}}
request.operation != 'CREATE' || !has(object.metadata.ownerReferences) || !object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)
{{- end -}}

{{/*
On CREATE, objects without our annotations are skipped: always for pods (the hot path),
and for workloads when the config has no cluster or namespace defaults and no guard
rails (then nothing can change or deny an unannotated Job, so it need not be sent).
*/}}
{{- define "rpw.cel.podCreateHasPolicy" -}}
request.operation != 'CREATE' || (has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('retry-policy.dev/')))
{{- end -}}

{{/*
Pod deletions by disruptors (webhook/admission/deletions.py): only a disruptor's, as the
config names them (config.disruptors; else the defaults of webhook/policy/config.py,
DEFAULT_DISRUPTOR_USERS), of a pod not yet disrupted and not yet terminal. The webhook
checks the same again: this only keeps every other deletion from reaching it.
*/}}
{{- define "rpw.disruptorUsers" -}}
{{- $d := (.Values.config | default dict).disruptors -}}
{{- if $d -}}
{{- toJson ($d.users | default list) -}}
{{- else -}}
{{- toJson (list "system:serviceaccount:kube-system:karpenter" "system:serviceaccount:karpenter:karpenter" "system:serviceaccount:kube-system:cluster-autoscaler") -}}
{{- end -}}
{{- end -}}

{{- define "rpw.disruptorGroups" -}}
{{- $d := (.Values.config | default dict).disruptors -}}
{{- toJson (($d | default dict).groups | default list) -}}
{{- end -}}

{{/* A DELETE carries the pod as oldObject (object is null): the pods of workloads that
ignore disruptions carry the label the webhook puts on their templates
(webhook/plan/causes.py). */}}
{{- define "rpw.cel.ignoresDisruptions" -}}
has(oldObject.metadata.labels) && 'retry-policy.dev/ignore-disruptions' in oldObject.metadata.labels
{{- end -}}

{{- define "rpw.cel.deletedByDisruptor" -}}
request.userInfo.username in {{ include "rpw.disruptorUsers" . }} || (has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {{ include "rpw.disruptorGroups" . }}))
{{- end -}}

{{- define "rpw.cel.notDisruptedYet" -}}
!has(oldObject.status) || !has(oldObject.status.conditions) || !oldObject.status.conditions.exists(c, c.type == 'DisruptionTarget' && c.status == 'True')
{{- end -}}

{{- define "rpw.cel.notTerminal" -}}
!has(oldObject.status) || !has(oldObject.status.phase) || !(oldObject.status.phase in ['Succeeded', 'Failed'])
{{- end -}}

{{/* "true" when the config can change or deny workloads that carry no annotations. */}}
{{- define "rpw.configAffectsUnannotated" -}}
{{- $c := .Values.config | default dict -}}
{{- if or $c.defaults $c.guardRails $c.namespaces -}}true{{- end -}}
{{- end -}}

{{- /* Where the API server calls the webhook: the chart's Service, or with webhook.url a
server outside the cluster (a developer's, `make cluster`'s), trusted through caBundle. */ -}}
{{- define "rpw.clientConfig" -}}
{{- with .ctx.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" .) $.path | quote }}
caBundle: {{ $.ctx.Values.webhook.caBundle | quote }}
{{- else }}
service:
  name: {{ include "rpw.serviceName" .ctx | quote }}
  namespace: {{ .ctx.Release.Namespace | quote }}
  path: {{ .path }}
  port: {{ .ctx.Values.service.port }}
{{- end }}
{{- end -}}

{{- define "rpw.webhookAnnotations" -}}
{{- if and .Values.certManager.enabled (not .Values.webhook.url) }}
cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "rpw.certificateName" .) }}
{{- end }}
{{- end -}}

{{/* Pod security ------------------------------------------------------------------ */}}

{{- define "rpw.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext -}}
{{- end -}}

{{- define "rpw.containerSecurityContext" -}}
{{- toYaml .Values.securityContext -}}
{{- end -}}

{{/*
NetworkPolicy peers from {cidrs, namespaceSelector, podSelector}: an ipBlock per CIDR, and
one peer with the selectors given (both: pods matching podSelector in those namespaces).
*/}}
{{- define "rpw.networkPeers" -}}
{{- $peers := list -}}
{{- range .cidrs -}}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" .)) -}}
{{- end -}}
{{- if or .namespaceSelector .podSelector -}}
{{- $peer := dict -}}
{{- with .namespaceSelector -}}{{- $_ := set $peer "namespaceSelector" . -}}{{- end -}}
{{- with .podSelector -}}{{- $_ := set $peer "podSelector" . -}}{{- end -}}
{{- $peers = append $peers $peer -}}
{{- end -}}
{{- toYaml $peers -}}
{{- end -}}
