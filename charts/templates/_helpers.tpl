{{/* Names, labels and image references shared by every template. */}}

{{- define "jitserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object name; 63 characters is the DNS label limit of Service names. */}}
{{- define "jitserve.fullname" -}}
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

{{- define "jitserve.operatorName" -}}
{{- printf "%s-operator" (include "jitserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jitserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: never add to these, a Deployment's selector is immutable across upgrades. */}}
{{- define "jitserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jitserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "jitserve.labels" -}}
helm.sh/chart: {{ include "jitserve.chart" . }}
app.kubernetes.io/name: {{ include "jitserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: jitserve
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "jitserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "jitserve.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An image reference from {repository, tag, digest}: registry + repository, then @digest if set
(immutable), else :tag, else :appVersion. Call with (dict "image" .Values.images.X "root" $).
*/}}
{{- define "jitserve.image" -}}
{{- $img := .image -}}
{{- if eq (toString $img.tag) "latest" -}}
{{- fail (printf "images: %s:latest is not a version; pin an exact tag (or leave tag empty for the chart's appVersion) or a digest" $img.repository) -}}
{{- end -}}
{{- $repo := printf "%s%s" (.root.Values.images.registry | default "") $img.repository -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* The labels the operator puts on every ServingPool child (jitserve.operator.api.pool_labels). */}}
{{- define "jitserve.poolChildSelector" -}}
matchLabels:
  app.kubernetes.io/part-of: jitserve
  app.kubernetes.io/managed-by: jitserve-operator
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values: [engine, router]
{{- end -}}

{{- define "jitserve.monitorNamespaces" -}}
{{- if . }}
namespaceSelector:
  matchNames:
{{ toYaml . | indent 4 }}
{{- else }}
namespaceSelector:
  any: true
{{- end }}
{{- end -}}
