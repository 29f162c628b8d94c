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
{{- .Values.config.name | default (printf "%s-config" .Release.Name) -}}
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
  image: {{ .root.Values.image.repository }}:{{ .root.Values.image.tag }}
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
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop:
        - ALL
    readOnlyRootFilesystem: true
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
