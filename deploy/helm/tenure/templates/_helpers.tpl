{{- define "tenure.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tenure.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tenure.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tenure.secretName" -}}
{{- .Values.existingSecret | default (include "tenure.fullname" .) -}}
{{- end -}}

{{- define "tenure.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{/* The environment every Tenure container shares: the ConfigMap, the Secret, and the
     multi-process metrics directory (an emptyDir, empty on every start). */}}
{{- define "tenure.env" -}}
envFrom:
  - configMapRef:
      name: {{ include "tenure.fullname" . }}
  - secretRef:
      name: {{ include "tenure.secretName" . }}
env:
  - name: PROMETHEUS_MULTIPROC_DIR
    value: /run/tenure-metrics
{{- end -}}

{{- define "tenure.metricsVolume" -}}
- name: metrics
  emptyDir:
    medium: Memory
{{- end -}}

{{- define "tenure.metricsMount" -}}
- name: metrics
  mountPath: /run/tenure-metrics
{{- end -}}

{{- define "tenure.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  capabilities:
    drop: ["ALL"]
{{- end -}}
