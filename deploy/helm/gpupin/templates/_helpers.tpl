{{/*
Names are fixed, as in deploy/kubernetes: the API objects name each other
(the policy the ServiceAccount, the agent its ConfigMap), and one agent per
node means one release per cluster.
*/}}
{{- define "gpupin.agent" -}}gpupin-agent{{- end -}}

{{/* Labels on every object; the pods keep only the selector's. */}}
{{- define "gpupin.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: gpupin
{{- end -}}

{{- define "gpupin.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount's user name, which the own-node policy matches. */}}
{{- define "gpupin.saUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "gpupin.agent" . }}
{{- end -}}
