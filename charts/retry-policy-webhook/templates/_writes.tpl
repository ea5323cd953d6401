{{/*
What the webhook's ServiceAccount writes, by the parts of it that are on: the RBAC
(rbac.yaml) and the admission policy (admission-policy.yaml) are both made from these, so
that a part switched off loses its writes in both.

  controller  the leader-elected controller (webhook/controller/): it needs a cluster
              (server.kube) and is on unless controller.enabled is false. It removes its
              retry-delay gates (patch pods), adds the budgets' conditions (patch
              pods/status), ends a pod that used its restarts in place by its deadline (patch pods), and
              writes each workload's record (patch Jobs and JobSets).
  deletions   the workers' marks of the pods a disruptor deleted (webhook/cluster/
              deletions.py): DisruptionTarget by patch of pods/status. Only pod DELETEs the
              pod-deletions webhook sends are marked, so it is on exactly when that webhook
              exists (webhooks.yaml).
Each is "true" or empty.
*/}}
{{- define "rpw.controllerOn" -}}
{{- if and .Values.controller.enabled (ne .Values.server.kube "off") -}}true{{- end -}}
{{- end -}}

{{- define "rpw.marksDeletions" -}}
{{- if and .Values.webhook.deletions.enabled (ne .Values.server.kube "off") (include "rpw.hasWorkloads" .) -}}true{{- end -}}
{{- end -}}

{{/* The controller writes records on JobSets (a JobSet's and a TrainJob's pods read them). */}}
{{- define "rpw.writesJobSets" -}}
{{- if and (include "rpw.controllerOn" .) (or .Values.webhook.kinds.jobSets .Values.webhook.kinds.trainJobs) -}}true{{- end -}}
{{- end -}}

{{/*
The ServiceAccounts' user names, as the API server names them in
request.userInfo.username (serviceaccount.MakeUsername, k8s.io/apiserver
pkg/authentication/serviceaccount/util.go).
*/}}
{{- define "rpw.webhookUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "rpw.serviceAccountName" .) -}}
{{- end -}}

{{- define "rpw.releaseGatesUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "rpw.releaseGatesName" .) -}}
{{- end -}}
