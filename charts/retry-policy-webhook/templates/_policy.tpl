{{/*
For the admission policy (admission-policy.yaml).

Whether the API server serves ValidatingAdmissionPolicy: admissionregistration.k8s.io/v1,
GA and on by default from Kubernetes 1.30 (the chart's kubeVersion floor). Against a
cluster, helm reads the API server's discovery, which names every served kind ("v1/Pod"
among them), and the policy is rendered where ValidatingAdmissionPolicy is one. `helm
template` without a cluster knows API versions but no kinds: then the Kubernetes version
(--kube-version) answers.
*/}}
{{- define "rpw.admissionPolicySupported" -}}
{{- $api := .Capabilities.APIVersions -}}
{{- if $api.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
true
{{- else if and (not ($api.Has "v1/Pod")) (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end -}}

{{/*
CEL, standard macros only (all, exists, filter, has): two maps are the same but for the
keys listed. Arguments: (list A B KEYS), each a CEL expression (KEYS a list of strings).
*/}}
{{- define "rpw.cel.sameExcept" -}}
{{- $a := index . 0 -}}{{- $b := index . 1 -}}{{- $keys := index . 2 -}}
({{ $a }}.all(k, k in {{ $keys }} || (k in {{ $b }} && {{ $a }}[k] == {{ $b }}[k])) && {{ $b }}.all(k, k in {{ $keys }} || k in {{ $a }}))
{{- end -}}
