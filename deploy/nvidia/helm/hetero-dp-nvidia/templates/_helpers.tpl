{{/*
Several configs in config.map, or an existing ConfigMap named by config.name: the
config manager (an init container and a sidecar)
writes the one the node label nvidia.com/device-plugin.config chooses to /config.
*/}}
{{- define "hetero-dp-nvidia.configManager" -}}
{{- if or .Values.config.name (gt (len .Values.config.map) 1) -}}true{{- end -}}
{{- end -}}

{{/* The ConfigMap holding the configs: config.name (made elsewhere) or ours. */}}
{{- define "hetero-dp-nvidia.configMapName" -}}
{{- .Values.config.name | default (printf "%s-config" (include "hetero-dp-nvidia.fullname" .)) -}}
{{- end -}}

{{/*
The config file CONFIG_FILE names with a single config: config.default, or the only
entry of config.map. A config.default that is not a key of config.map is refused.
*/}}
{{- define "hetero-dp-nvidia.configName" -}}
{{- $names := keys .Values.config.map | sortAlpha -}}
{{- if .Values.config.default -}}
{{- if not (hasKey .Values.config.map .Values.config.default) -}}
{{- fail (printf "config.default %q is not a key of config.map (keys: %s)" .Values.config.default (join ", " $names)) -}}
{{- end -}}
{{- .Values.config.default -}}
{{- else -}}
{{- first $names -}}
{{- end -}}
{{- end -}}

{{/*
A config-manager container (init: --oneshot). Only these containers get an API token
(a projected volume at the usual path): the plugin itself never talks to the API.
*/}}
{{- define "hetero-dp-nvidia.configManagerContainer" -}}
- name: {{ .name }}
  image: {{ include "hetero-dp-nvidia.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command:
    - hetero-dp-nvidia-config-manager
    {{- if .oneshot }}
    - --oneshot
    {{- end }}
  env:
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: NODE_LABEL
      value: nvidia.com/device-plugin.config
    - name: CONFIG_FILE_SRCDIR
      value: /available-configs
    - name: CONFIG_FILE_DST
      value: /config/config.yaml
    - name: DEFAULT_CONFIG
      value: {{ .root.Values.config.default | quote }}
    - name: FALLBACK_STRATEGIES
      value: {{ join "," .root.Values.config.fallbackStrategies | quote }}
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop:
        - ALL
    readOnlyRootFilesystem: true
    seccompProfile:
      type: RuntimeDefault
  volumeMounts:
    - name: available-configs
      mountPath: /available-configs
      readOnly: true
    - name: config
      mountPath: /config
    - name: api-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
{{- end -}}

{{/*
Names as NVIDIA's chart makes them: fullnameOverride; else the release name, with
nameOverride appended when the release name does not contain it. 63 characters at most.
*/}}
{{- define "hetero-dp-nvidia.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if and .Values.nameOverride (not (contains .Values.nameOverride .Release.Name)) -}}
{{- printf "%s-%s" .Release.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hetero-dp-nvidia.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{/* The pod selector: selectorLabelsOverride, else the app name. */}}
{{- define "hetero-dp-nvidia.selectorLabels" -}}
{{- if .Values.selectorLabelsOverride -}}
{{- toYaml .Values.selectorLabelsOverride -}}
{{- else -}}
app.kubernetes.io/name: {{ .Values.nameOverride | default "hetero-dp-nvidia" }}
{{- end -}}
{{- end -}}

{{/*
Values an NVIDIA chart user may bring that this chart cannot honour: refused here with
the reason (values.schema.json refuses unknown keys and wrong types).
*/}}
{{- define "hetero-dp-nvidia.validate" -}}
{{- if .Values.gfd.enabled -}}
{{- fail "gfd.enabled: this chart does not deploy GPU feature discovery; hetero-dp writes GFD's node labels itself (labels.enabled, docs/nvidia.md), so leave gfd.enabled false" -}}
{{- end -}}
{{- if get .Values.nfd "enabled" -}}
{{- fail "nfd.enabled: this chart does not deploy Node Feature Discovery; install NFD's own chart if you need it, and leave nfd.enabled unset" -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.cdi.featureFlags) -}}
{{- fail "cdi.featureFlags: NVIDIA's CDI feature flags are not supported by hetero-dp's CDI spec writer; remove cdi.featureFlags" -}}
{{- end -}}
{{- if and (eq (include "hetero-dp-nvidia.namespace" .) "default") (eq (toString .Values.allowDefaultNamespace) "false") -}}
{{- fail "allowDefaultNamespace is false and the release is in the \"default\" namespace: install into another namespace (-n kube-system) or set allowDefaultNamespace" -}}
{{- end -}}
{{- if and .Values.config.map (not .Values.config.name) -}}
{{- $_ := include "hetero-dp-nvidia.configName" . -}}
{{- end -}}
{{- end -}}

{{- define "hetero-dp-nvidia.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
