package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	egv1 "github.com/envoyproxy/gateway/api/v1alpha1"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3" // a client's x-tollgate-* removed
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"         // repeated descriptor headers refused
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"       // the ratelimit filter's typed_config
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // the gRPC cluster's protocol options
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istioext "istio.io/api/extensions/v1alpha1"
	istionet "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-rl/tollgate/filter/pluginconf"
)

const chart = "helm/tollgate"

// helm is the Helm binary make deps installs (bin/helm), or one on PATH.
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	bin, err := filepath.Abs("../bin/helm")
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		if bin, err = exec.LookPath("helm"); err != nil {
			t.Fatal("helm is not installed: run `make helm` (it builds bin/helm from helm.sh/helm/v3; make test does it first)")
		}
	}
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// valueSets are the installs the chart must render: an external Redis, the
// trial Redis with Istio and its rate limit service, and Envoy Gateway with
// autoscaling.
var valueSets = map[string][]string{
	"external redis":           {"--set", "redis.url=redis-sentinel://s1:26379\\,s2:26379/0?master=mymaster"},
	"trial redis with istio":   {"--set", "redis.trial.enabled=true", "--set", "istio.enabled=true", "--set", "istio.rateLimitService.enabled=true"},
	"istio, external service":  {"--set", "redis.url=redis://r:6379/0", "--set", "istio.enabled=true", "--set", "istio.externalHost=tollgate.example.com"},
	"envoy gateway, autoscale": {"--set", "redis.url=redis-cluster://c1:6379\\,c2:6379", "--set", "envoyGateway.enabled=true", "--set", "envoyGateway.rateLimitService.enabled=true", "--set", "controlsvc.autoscaling.enabled=true"},
}

func TestChartLints(t *testing.T) {
	for name, set := range valueSets {
		t.Run(name, func(t *testing.T) { helm(t, append([]string{"lint", "--strict", chart}, set...)...) })
	}
}

// Without a Redis, the chart refuses to render and says what to set.
func TestChartNeedsARedis(t *testing.T) {
	bin, _ := filepath.Abs("../bin/helm")
	out, err := exec.Command(bin, "template", "t", chart).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "redis.url is required") {
		t.Fatalf("rendered without a Redis: %v\n%s", err, out)
	}
}

// rendered is one object of a rendering: its kind and its JSON.
type rendered struct {
	kind, name string
	json       []byte
}

func render(t *testing.T, set []string) []rendered {
	t.Helper()
	out := helm(t, append([]string{"template", "t", chart, "--namespace", "tollgate"}, set...)...)
	var objs []rendered
	for _, doc := range strings.Split(string(out), "\n---") {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("a rendered document is not YAML: %v\n%s", err, doc)
		}
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if string(j) == "null" {
			continue
		}
		if err := json.Unmarshal(j, &head); err != nil || head.Kind == "" {
			t.Fatalf("a rendered document has no kind: %v\n%s", err, doc)
		}
		objs = append(objs, rendered{head.Kind, head.Metadata.Name, j})
	}
	return objs
}

// strict decodes j into v, refusing unknown fields.
func strict(t *testing.T, what string, j []byte, v any) {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(j))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		t.Fatalf("%s does not decode strictly: %v\n%s", what, err, j)
	}
}

// istioObject decodes an Istio object: metadata as Kubernetes's, spec as
// Istio's published protobuf type (protojson refuses unknown fields).
func istioObject(t *testing.T, o rendered, spec proto.Message) {
	t.Helper()
	var env struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       json.RawMessage   `json:"spec"`
	}
	strict(t, o.kind, o.json, &env)
	if err := protojson.Unmarshal(env.Spec, spec); err != nil {
		t.Fatalf("%s %s spec: %v\n%s", o.kind, o.name, err, env.Spec)
	}
}

// envoyJSON decodes a JSON value into an Envoy proto, strictly.
func envoyJSON(t *testing.T, what string, v any, m proto.Message) {
	t.Helper()
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(j, m); err != nil {
		t.Fatalf("%s is not a valid Envoy %T: %v\n%s", what, m, err, j)
	}
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			t.Fatalf("%s breaks Envoy's constraints: %v", what, err)
		}
	}
}

// pluginConfig checks that a rendered filter configuration is one the filter
// accepts, with the token from the environment only.
func pluginConfig(t *testing.T, what string, v any) *pluginconf.Config {
	t.Helper()
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pluginconf.Parse(j)
	if err != nil {
		t.Fatalf("%s: the filter refuses it: %v\n%s", what, err, j)
	}
	if c.DecisionToken != "" || c.DecisionTokenEnv == "" {
		t.Fatalf("%s: the token must come from the VM's environment, not the configuration", what)
	}
	return c
}

// Every rendered object decodes strictly into its published Go type, and
// the control service's pod is locked down.
func TestChartObjectsDecodeStrictly(t *testing.T) {
	for name, set := range valueSets {
		t.Run(name, func(t *testing.T) {
			kinds := map[string]int{}
			refusesRepeats := false // the Lua filter beside a rate limit filter
			for _, o := range render(t, set) {
				kinds[o.kind]++
				switch o.kind {
				case "Deployment":
					var d appsv1.Deployment
					strict(t, o.kind, o.json, &d)
					checkControlService(t, &d, slices.Contains(set, "controlsvc.autoscaling.enabled=true"))
				case "StatefulSet":
					var s appsv1.StatefulSet
					strict(t, o.kind, o.json, &s)
					checkLockedDown(t, "redis", &s.Spec.Template.Spec)
					if s.Annotations["tollgate.io/not-for-production"] == "" {
						t.Error("the trial Redis is not marked as not for production")
					}
				case "Service":
					strict(t, o.kind, o.json, &corev1.Service{})
				case "ConfigMap":
					var c corev1.ConfigMap
					strict(t, o.kind, o.json, &c)
					checkNoSecrets(t, c.Data["tollgate.toml"])
				case "PodDisruptionBudget":
					var p policyv1.PodDisruptionBudget
					strict(t, o.kind, o.json, &p)
					if p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() < 1 {
						t.Errorf("disruption budget %+v", p.Spec)
					}
				case "HorizontalPodAutoscaler":
					strict(t, o.kind, o.json, &autoscalingv2.HorizontalPodAutoscaler{})
				case "NetworkPolicy":
					strict(t, o.kind, o.json, &networkingv1.NetworkPolicy{})
				case "WasmPlugin":
					var w istioext.WasmPlugin
					istioObject(t, o, &w)
					c := pluginConfig(t, "WasmPlugin pluginConfig", w.GetPluginConfig().AsMap())
					if !strings.HasPrefix(w.GetUrl(), "oci://") || len(w.GetVmConfig().GetEnv()) != 1 ||
						w.GetVmConfig().GetEnv()[0].GetName() != c.DecisionTokenEnv || w.GetVmConfig().GetEnv()[0].GetValueFrom() != istioext.EnvValueSource_HOST {
						t.Errorf("WasmPlugin %v: want an OCI image and the token variable from the host", &w)
					}
					if !strings.HasPrefix(c.ControlCluster, "outbound|8081||") {
						t.Errorf("callout cluster %q is not Istio's outbound cluster of the control service", c.ControlCluster)
					}
				case "DestinationRule":
					istioObject(t, o, &istionet.DestinationRule{})
				case "ServiceEntry":
					istioObject(t, o, &istionet.ServiceEntry{})
				case "EnvoyFilter":
					var f istionet.EnvoyFilter
					istioObject(t, o, &f)
					for _, p := range f.GetConfigPatches() {
						switch p.GetApplyTo() {
						case istionet.EnvoyFilter_HTTP_FILTER:
							var hf hcmv3.HttpFilter
							envoyJSON(t, "EnvoyFilter http filter", p.GetPatch().GetValue().AsMap(), &hf)
							refusesRepeats = refusesRepeats || isRefuseRepeats(t, &hf)
						case istionet.EnvoyFilter_NETWORK_FILTER:
							m := p.GetPatch().GetValue().AsMap()
							tc, _ := m["typed_config"].(map[string]any)
							delete(tc, "@type")                                               // the merge's own; the rest is the manager's
							tc["stat_prefix"], tc["route_config"] = "check", map[string]any{} // what a merge lands in
							envoyJSON(t, "EnvoyFilter connection manager", tc, &hcmv3.HttpConnectionManager{})
							if o, _ := tc["common_http_protocol_options"].(map[string]any); o["headers_with_underscores_action"] != "REJECT_REQUEST" {
								t.Errorf("the gateway lets header names with underscores through: %v", tc)
							}
						case istionet.EnvoyFilter_VIRTUAL_HOST:
							vh := p.GetPatch().GetValue().AsMap()
							vh["name"], vh["domains"] = "check", []any{"*"} // what a merge lands in
							envoyJSON(t, "EnvoyFilter virtual host", vh, &routev3.VirtualHost{})
						default:
							t.Errorf("unexpected patch %v", p.GetApplyTo())
						}
					}
				case "EnvoyExtensionPolicy":
					var p egv1.EnvoyExtensionPolicy
					strict(t, o.kind, o.json, &p)
					if len(p.Spec.Wasm) != 1 || p.Spec.Wasm[0].Code.Type != egv1.ImageWasmCodeSourceType || p.Spec.Wasm[0].Env == nil {
						t.Fatalf("extension policy %+v", p.Spec)
					}
					var cfg map[string]any
					json.Unmarshal(p.Spec.Wasm[0].Config.Raw, &cfg)
					c := pluginConfig(t, "EnvoyExtensionPolicy config", cfg)
					if !slices.Contains(p.Spec.Wasm[0].Env.HostKeys, c.DecisionTokenEnv) {
						t.Errorf("the token variable %s is not among hostKeys %v", c.DecisionTokenEnv, p.Spec.Wasm[0].Env.HostKeys)
					}
				case "EnvoyPatchPolicy":
					var p egv1.EnvoyPatchPolicy
					strict(t, o.kind, o.json, &p)
					for _, jp := range p.Spec.JSONPatches {
						var v any
						json.Unmarshal(jp.Operation.Value.Raw, &v)
						switch jp.Type {
						case egv1.ClusterEnvoyResourceType:
							envoyJSON(t, "EnvoyPatchPolicy cluster", v, &clusterv3.Cluster{})
						case egv1.ListenerEnvoyResourceType:
							var hf hcmv3.HttpFilter
							envoyJSON(t, "EnvoyPatchPolicy listener filter", v, &hf)
							refusesRepeats = refusesRepeats || isRefuseRepeats(t, &hf)
						case egv1.RouteConfigurationEnvoyResourceType:
							// Every virtual host (one per hostname in Envoy
							// Gateway), not the first only.
							if op := jp.Operation; op.JSONPath == nil || *op.JSONPath != "$.virtual_hosts[*]" || op.Path == nil || *op.Path != "/rate_limits" {
								t.Errorf("route patch at %v %v: want every virtual host's /rate_limits", op.JSONPath, op.Path)
							}
							actions, _ := v.([]any)
							if len(actions) == 0 {
								t.Fatalf("route patch %v: want rate limit actions", v)
							}
							for _, a := range actions {
								envoyJSON(t, "EnvoyPatchPolicy route rate limit", a, &routev3.RateLimit{})
							}
						default:
							t.Errorf("unexpected patch of %s", jp.Type)
						}
					}
				default:
					t.Errorf("rendered %s %s, which no test decodes", o.kind, o.name)
				}
			}
			if (kinds["EnvoyFilter"] > 0 || kinds["EnvoyPatchPolicy"] > 0) && !refusesRepeats {
				t.Error("a gateway asks the rate limit service without refusing repeated descriptor headers first")
			}
			for _, k := range []string{"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} {
				if kinds[k] == 0 {
					t.Errorf("no %s rendered", k)
				}
			}
		})
	}
}

// checkControlService asserts what an operator relies on in the pod.
func checkControlService(t *testing.T, d *appsv1.Deployment, autoscaled bool) {
	t.Helper()
	if !autoscaled && (d.Spec.Replicas == nil || *d.Spec.Replicas < 2) {
		t.Errorf("replicas %v, want at least 2", d.Spec.Replicas)
	}
	ps := &d.Spec.Template.Spec
	checkLockedDown(t, "controlsvc", ps)
	if ps.TerminationGracePeriodSeconds == nil || *ps.TerminationGracePeriodSeconds <= 10+5 {
		t.Errorf("terminationGracePeriodSeconds %v: want longer than the service's 10 s drain and the preStop pause", ps.TerminationGracePeriodSeconds)
	}
	c := ps.Containers[0]
	// Neither probe asks Redis: with Redis down a replica still decides
	// (its failure_mode), and one taken out of the Service left the
	// proxies' fallback, which checks no API key, to decide.
	if c.ReadinessProbe == nil || c.ReadinessProbe.TCPSocket == nil || c.LivenessProbe == nil || c.LivenessProbe.TCPSocket == nil {
		t.Errorf("probes: readiness %+v, liveness %+v; want both on the port, not on /health", c.ReadinessProbe, c.LivenessProbe)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v", c.Resources)
	}
	fromSecret := map[string]bool{}
	for _, e := range c.Env {
		if strings.Contains(e.Name, "TOKEN") {
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Errorf("%s is not taken from a Secret", e.Name)
			}
			fromSecret[e.Name] = true
		}
		if e.Name == "TOLLGATE_REDIS_URL" && e.Value == "" {
			t.Error("no Redis URL")
		}
	}
	if !fromSecret["TOLLGATE_ADMIN_TOKEN"] || !fromSecret["TOLLGATE_DECISION_TOKEN"] {
		t.Errorf("tokens from Secrets: %v", fromSecret)
	}
}

// checkLockedDown: no service-account token, non-root, read-only root,
// no privilege escalation, every capability dropped.
func checkLockedDown(t *testing.T, what string, ps *corev1.PodSpec) {
	t.Helper()
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("%s mounts a service-account token", what)
	}
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
		t.Errorf("%s may run as root", what)
	}
	for _, c := range ps.Containers {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("%s/%s has no security context", what, c.Name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("%s/%s has a writable root filesystem", what, c.Name)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("%s/%s may escalate privileges", what, c.Name)
		case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
			t.Errorf("%s/%s keeps capabilities", what, c.Name)
		}
	}
}

func checkNoSecrets(t *testing.T, toml string) {
	t.Helper()
	for _, k := range []string{"admin_token", "decision_token"} {
		for _, line := range strings.Split(toml, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), k) {
				t.Errorf("the ConfigMap sets %s: tokens belong in Secrets", k)
			}
		}
	}
}

// The values file holds no token, and the configuration the chart renders
// is one the control service accepts (its own -check-config, with the
// environment the pod gets).
func TestChartConfigIsAccepted(t *testing.T) {
	values, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(values), "\n") {
		l := strings.TrimSpace(line)
		if !strings.HasPrefix(l, "#") && strings.Contains(strings.ToLower(l), "token:") && !strings.Contains(l, "tokenEnv:") {
			t.Errorf("values.yaml holds a token: %s", l)
		}
	}
	var dep appsv1.Deployment
	var toml string
	for _, o := range render(t, valueSets["external redis"]) {
		switch o.kind {
		case "Deployment":
			strict(t, o.kind, o.json, &dep)
		case "ConfigMap":
			var c corev1.ConfigMap
			strict(t, o.kind, o.json, &c)
			toml = c.Data["tollgate.toml"]
		}
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tollgate.toml")
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := controlsvcBinary(t)
	env := []string{"TOLLGATE_ADMIN_TOKEN=" + strings.Repeat("a", 40), "TOLLGATE_DECISION_TOKEN=" + strings.Repeat("d", 40)}
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			env = append(env, fmt.Sprintf("%s=%s", e.Name, e.Value))
		}
	}
	cmd := exec.Command(bin, "-config", cfg, "-check-config")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the control service refuses the chart's configuration: %v\n%s", err, out)
	}
}

// isRefuseRepeats reports whether hf is the Lua filter that refuses a
// repeated descriptor header, with the code of envoy/envoy-rls.yaml (whose
// tests check that code against the descriptors and compile it).
func isRefuseRepeats(t *testing.T, hf *hcmv3.HttpFilter) bool {
	t.Helper()
	if hf.GetName() != "envoy.filters.http.lua" {
		return false
	}
	var lua luav3.Lua
	if err := hf.GetTypedConfig().UnmarshalTo(&lua); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../envoy/envoy-rls.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The block under its inline_string: |, less its indentation.
	_, block, _ := strings.Cut(string(raw), "inline_string: |\n")
	var want, indent string
	for _, line := range strings.SplitAfter(block, "\n") {
		if indent == "" {
			indent = line[:len(line)-len(strings.TrimLeft(line, " "))]
		}
		if !strings.HasPrefix(line, indent) {
			break
		}
		want += strings.TrimPrefix(line, indent)
	}
	if got := lua.GetDefaultSourceCode().GetInlineString(); got != want {
		t.Errorf("the chart's Lua filter differs from envoy/envoy-rls.yaml's:\n%s\nwant:\n%s", got, want)
	}
	return true
}
