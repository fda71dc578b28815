{{/* Labels every object of the release carries. */}}
{{- define "klear.labels" -}}
app.kubernetes.io/name: klear-reasoner
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: klear
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Name of an object of this release: "<release>-<suffix>", cut to 63 characters. */}}
{{- define "klear.name" -}}
{{- printf "%s-%s" .root.Release.Name .suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* An image of the project: registry/klear-<role>:tag (role: cpu or gpu), as pipelines compiled with
     KLEAR_IMAGE_REGISTRY / KLEAR_IMAGE_TAG name them. */}}
{{- define "klear.image" -}}
{{- $images := .root.Values.images -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $images.registry) (index $images .role) (default .root.Chart.AppVersion $images.tag) -}}
{{- end -}}

{{/* The Secret the stages and KFP's launcher read S3 credentials from. */}}
{{- define "klear.s3Secret" -}}
{{- default .Values.s3.secretName .Values.s3.existingSecret -}}
{{- end -}}

{{/* imagePullSecrets of a pod spec, when any are set. */}}
{{- define "klear.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Scheduling of a pod spec: nodeSelector, tolerations and affinity of one component, when set. */}}
{{- define "klear.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The restricted Pod Security profile for a container that needs nothing more. */}}
{{- define "klear.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  runAsNonRoot: true
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}
