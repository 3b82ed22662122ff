{{/* The release's objects are named for it: tollgate, or <release>-tollgate. */}}
{{- define "tollgate.fullname" -}}
{{- if contains "tollgate" .Release.Name -}}{{ .Release.Name | trunc 53 | trimSuffix "-" }}{{- else -}}{{ printf "%s-tollgate" .Release.Name | trunc 53 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "tollgate.controlsvc" -}}{{ include "tollgate.fullname" . }}-controlsvc{{- end -}}
{{- define "tollgate.redis" -}}{{ include "tollgate.fullname" . }}-redis{{- end -}}

{{/* The control service's in-cluster host name. */}}
{{- define "tollgate.controlsvcHost" -}}
{{- if .Values.istio.externalHost -}}{{ .Values.istio.externalHost }}{{- else -}}{{ include "tollgate.controlsvc" . }}.{{ .Release.Namespace }}.svc.cluster.local{{- end -}}
{{- end -}}

{{- define "tollgate.labels" -}}
app.kubernetes.io/name: tollgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tollgate.selector" -}}
app.kubernetes.io/name: tollgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tollgate.redisURL" -}}
{{- if .Values.redis.trial.enabled -}}
redis://{{ include "tollgate.redis" . }}.{{ .Release.Namespace }}.svc.cluster.local:6379/0
{{- else -}}
{{- required "redis.url is required (an external Redis), or set redis.trial.enabled=true for a trial Redis" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.image" -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end -}}

{{/* The filter's plugin configuration: the token from the VM's environment. */}}
{{- define "tollgate.pluginConfig" -}}
{
  "control_cluster": {{ .cluster | quote }},
  "control_authority": {{ .authority | quote }},
  "timeout_ms": 250,
  "failure_mode": {{ .failureMode | quote }},
  "decision_token_env": {{ .tokenEnv | quote }},
  "api_key_header": "x-api-key",
  "headers": {"x_ratelimit": true, "ietf": true},
  "lease": {"request": 10, "slots": 16384},
  "breaker": {"failures": 5, "cooldown_ms": 2000},
  "fallback": {"limit": 100, "window_seconds": 60}
}
{{- end -}}

{{/* The descriptors Envoy's ratelimit filter sends for the tollgate domain. */}}
{{/*
The HTTP filter that removes a client's x-tollgate-* headers before the
rate limit filter: an upstream may read the service's
x-tollgate-decision (degraded), never a client's.
*/}}
{{- define "tollgate.stripForged" -}}
name: envoy.filters.http.header_mutation
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
  mutations:
    request_mutations:
      - remove: x-tollgate-identity
      - remove: x-tollgate-tier
      - remove: x-tollgate-decision
{{- end }}

{{/*
The HTTP filter that refuses a request repeating a header the descriptors
read by name: Envoy's request_headers action passes only the first, and an
upstream may read another. Its code is envoy/envoy-rls.yaml's (the chart's
tests hold them equal).
*/}}
{{- define "tollgate.refuseRepeats" -}}
name: envoy.filters.http.lua
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
  default_source_code:
    inline_string: |
      local once = {"x-api-key", "x-http-method-override", "x-method-override", "x-http-method"}
      function envoy_on_request(handle)
        local headers = handle:headers()
        for _, name in ipairs(once) do
          if headers:getNumValues(name) > 1 then
            handle:respond({[":status"] = "400", ["content-type"] = "application/json"},
              '{"error":{"code":"INVALID_INPUT","message":"more than one ' .. name .. ' header"}}')
            return
          end
        end
      end
{{- end }}

{{- define "tollgate.rlsActions" -}}
- actions:
  - remote_address: {}
  - request_headers: {header_name: ":path", descriptor_key: tollgate.path}
  - request_headers: {header_name: ":method", descriptor_key: tollgate.method}
  - request_headers: {header_name: x-http-method-override, descriptor_key: tollgate.method_override, skip_if_absent: true}
  - request_headers: {header_name: x-method-override, descriptor_key: tollgate.method_override, skip_if_absent: true}
  - request_headers: {header_name: x-http-method, descriptor_key: tollgate.method_override, skip_if_absent: true}
  - request_headers: {header_name: x-api-key, descriptor_key: tollgate.api_key, skip_if_absent: true}
{{- end -}}

{{/* The decision token for Envoy's gRPC metadata: read from the Secret at
install time (never from values); offline rendering shows a placeholder. */}}
{{- define "tollgate.rlsToken" -}}
{{- $s := lookup "v1" "Secret" .Release.Namespace .Values.controlsvc.secretName -}}
{{- if and $s $s.data (index $s.data "decision-token") -}}{{ index $s.data "decision-token" | b64dec | splitList "," | first | trim }}{{- else -}}SET-AT-INSTALL-FROM-THE-SECRET{{- end -}}
{{- end -}}
