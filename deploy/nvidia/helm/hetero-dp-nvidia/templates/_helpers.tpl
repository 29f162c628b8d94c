{{/*
The config file CONFIG_FILE names: config.default, or the only entry of config.map.
Several entries and no default is refused: which one would every node get?
*/}}
{{- define "hetero-dp-nvidia.configName" -}}
{{- $names := keys .Values.config.map | sortAlpha -}}
{{- if .Values.config.default -}}
{{- if not (hasKey .Values.config.map .Values.config.default) -}}
{{- fail (printf "config.default %q is not a key of config.map (keys: %s)" .Values.config.default (join ", " $names)) -}}
{{- end -}}
{{- .Values.config.default -}}
{{- else if eq (len $names) 1 -}}
{{- first $names -}}
{{- else -}}
{{- fail (printf "config.map has %d entries (%s) and config.default is empty: set config.default to the one to use" (len $names) (join ", " $names)) -}}
{{- end -}}
{{- end -}}
