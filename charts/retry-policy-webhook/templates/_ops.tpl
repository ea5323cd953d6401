{{/* The operations pack (prometheusrule.yaml, dashboard.yaml): docs/OPERATIONS.md#alerts. */}}

{{/* PromQL label matchers that pick this release's series out of a Prometheus's. */}}
{{- define "rpw.ops.selector" -}}
{{- .Values.prometheusRule.selector | default (printf "namespace=%q" .Release.Namespace) -}}
{{- end -}}

{{/* An alert's runbook, its section of docs/OPERATIONS.md: (list $ "<anchor>"). */}}
{{- define "rpw.ops.runbook" -}}
{{- $root := index . 0 -}}
{{- $anchor := index . 1 -}}
runbook: {{ printf "docs/OPERATIONS.md#%s" $anchor | quote }}
{{- with $root.Values.prometheusRule.runbookBaseURL }}
runbook_url: {{ printf "%s#%s" (trimSuffix "#" .) $anchor | quote }}
{{- end }}
{{- end -}}

{{/* An alert's labels: its severity and the release's alertLabels: (list $ "<severity>"). */}}
{{- define "rpw.ops.labels" -}}
{{- $root := index . 0 -}}
severity: {{ index . 1 }}
{{- with $root.Values.prometheusRule.alertLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Metrics must be served for the pack to watch anything. */}}
{{- define "rpw.ops.needsMetrics" -}}
{{- if not .Values.metrics.port -}}
{{- fail "prometheusRule and grafanaDashboard need the metrics port: set metrics.port" -}}
{{- end -}}
{{- end -}}
