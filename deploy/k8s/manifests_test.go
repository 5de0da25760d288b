// Package k8s holds the Kubernetes manifests (the YAML files beside this test) and their test.
package k8s

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// objects decodes every document of every manifest strictly (an unknown or misspelt field fails) into its
// k8s.io/api type, keyed by kind/name.
func objects(t *testing.T) map[string]any {
	t.Helper()
	files, _ := filepath.Glob("*.yaml")
	if len(files) < 4 {
		t.Fatalf("manifests: %v", files)
	}
	out := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(b), "\n---\n") {
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			var obj any
			var name string
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				var d appsv1.Deployment
				err = yaml.UnmarshalStrict([]byte(doc), &d)
				obj, name = &d, d.Name
			case "v1 Service":
				var s corev1.Service
				err = yaml.UnmarshalStrict([]byte(doc), &s)
				obj, name = &s, s.Name
			case "v1 ConfigMap":
				var c corev1.ConfigMap
				err = yaml.UnmarshalStrict([]byte(doc), &c)
				obj, name = &c, c.Name
			default:
				t.Fatalf("%s #%d: unexpected %s %s", f, i, meta.APIVersion, meta.Kind)
			}
			if err != nil {
				t.Fatalf("%s #%d (%s): %v", f, i, meta.Kind, err)
			}
			out[meta.Kind+"/"+name] = obj
		}
	}
	return out
}

// gatewayConfig is the part of kvgate's config the manifests must agree with (read leniently: the file
// is kvgate's own format, checked by gateway/config's tests).
type gatewayConfig struct {
	Listen string `json:"listen"`
	Store  struct {
		Addrs []string `json:"addrs"`
	} `json:"store"`
	AdminTokenEnv    string `json:"admin_token_env"`
	ClientAPIKeysEnv string `json:"client_api_keys_env"`
	Models           []struct {
		Tokenizer     string `json:"tokenizer"`
		EndpointsFrom struct {
			DNS          string `json:"dns"`
			Port         int32  `json:"port"`
			KVEventsPort int32  `json:"kv_events_port"`
			KVReplayPort int32  `json:"kv_replay_port"`
			Engine       string `json:"engine"`
			Refresh      string `json:"refresh"`
		} `json:"endpoints_from"`
	} `json:"models"`
}

func port(t *testing.T, hostport string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("address %q", hostport)
	}
	return int32(n)
}

func servicePort(t *testing.T, s *corev1.Service, name string) corev1.ServicePort {
	t.Helper()
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("service %s has no port %q", s.Name, name)
	return corev1.ServicePort{}
}

// Issue 18: every manifest decodes strictly with the k8s.io/api types, and they agree with the config they
// mount: the gateway's probes hit /healthz and /readyz on the port it listens on; the headless vLLM Service
// publishes the ports endpoints_from names; the store address is the Redis Service; secrets feed the
// variables the config names; every container requests CPU and memory.
func TestManifests(t *testing.T) {
	objs := objects(t)
	get := func(key string) any {
		o, ok := objs[key]
		if !ok {
			t.Fatalf("no %s among %d objects", key, len(objs))
		}
		return o
	}
	cm := get("ConfigMap/kvgate-config").(*corev1.ConfigMap)
	var cfg gatewayConfig
	if err := yaml.Unmarshal([]byte(cm.Data["kvgate.yaml"]), &cfg); err != nil {
		t.Fatalf("kvgate.yaml: %v", err)
	}
	listen := port(t, cfg.Listen)
	if len(cfg.Models) != 1 {
		t.Fatalf("models: %+v", cfg.Models)
	}

	gw := get("Deployment/kvgate").(*appsv1.Deployment)
	if gw.Spec.Replicas == nil || *gw.Spec.Replicas < 2 {
		t.Fatalf("gateway replicas %v: a fleet is at least two", gw.Spec.Replicas)
	}
	pod := gw.Spec.Template.Spec
	c := pod.Containers[0]
	var http *corev1.ContainerPort
	for i := range c.Ports {
		if c.Ports[i].Name == "http" {
			http = &c.Ports[i]
		}
	}
	if http == nil || http.ContainerPort != listen {
		t.Fatalf("container port http %+v, config listens on %d", http, listen)
	}
	probe := func(p *corev1.Probe, path string) {
		t.Helper()
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path {
			t.Fatalf("probe %+v, want GET %s", p, path)
		}
		if pt := p.HTTPGet.Port; !(pt.Type == intstr.String && pt.StrVal == "http") && !(pt.Type == intstr.Int && pt.IntVal == listen) {
			t.Fatalf("probe %s on port %v, the gateway listens on %d (http)", path, pt.String(), listen)
		}
	}
	probe(c.ReadinessProbe, "/readyz")
	probe(c.LivenessProbe, "/healthz")
	probe(c.StartupProbe, "/healthz")
	// --config points into the ConfigMap's mount.
	var cfgPath string
	for i, a := range c.Args {
		if a == "--config" && i+1 < len(c.Args) {
			cfgPath = c.Args[i+1]
		}
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name && cfgPath == filepath.Join(m.MountPath, "kvgate.yaml") {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Fatalf("--config %q is not kvgate.yaml of a mounted %s", cfgPath, cm.Name)
	}
	envs := map[string]bool{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			envs[e.Name] = true
		}
	}
	if !envs[cfg.AdminTokenEnv] || !envs[cfg.ClientAPIKeysEnv] {
		t.Fatalf("secret env %v, config names %s and %s", envs, cfg.AdminTokenEnv, cfg.ClientAPIKeysEnv)
	}
	if !strings.HasPrefix(cfg.Models[0].Tokenizer, "/etc/kvgate/models/") {
		t.Fatalf("tokenizer %q is not in the image", cfg.Models[0].Tokenizer)
	}
	svc := get("Service/kvgate").(*corev1.Service)
	if p := servicePort(t, svc, "http"); p.TargetPort.StrVal != "http" || svc.Spec.Selector["app.kubernetes.io/name"] != gw.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Fatalf("gateway service %+v", svc.Spec)
	}

	ef := cfg.Models[0].EndpointsFrom
	vllm := get("Service/" + ef.DNS).(*corev1.Service)
	if vllm.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("vLLM service %s is not headless: clusterIP %q", vllm.Name, vllm.Spec.ClusterIP)
	}
	for name, want := range map[string]int32{"http": ef.Port, "kv-events": ef.KVEventsPort, "kv-replay": ef.KVReplayPort} {
		if p := servicePort(t, vllm, name); p.Port != want || p.TargetPort.IntVal != want {
			t.Fatalf("vLLM service port %s: %+v, endpoints_from says %d", name, p, want)
		}
	}
	if d, err := time.ParseDuration(ef.Refresh); err != nil || d <= 0 || ef.Engine != "vllm" {
		t.Fatalf("endpoints_from: %+v", ef)
	}

	host, _, _ := net.SplitHostPort(cfg.Store.Addrs[0])
	rs := get("Service/" + host).(*corev1.Service)
	rd := get("Deployment/" + host).(*appsv1.Deployment)
	rp := servicePort(t, rs, "redis")
	rc := rd.Spec.Template.Spec.Containers[0]
	if rp.Port != port(t, cfg.Store.Addrs[0]) || rc.Ports[0].Name != rp.TargetPort.StrVal || rc.Ports[0].ContainerPort != 6379 ||
		rc.ReadinessProbe == nil || rc.LivenessProbe == nil {
		t.Fatalf("redis: service %+v container %+v", rp, rc.Ports)
	}
	for key, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			for _, c := range d.Spec.Template.Spec.Containers {
				if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
					t.Fatalf("%s container %s requests no cpu or memory", key, c.Name)
				}
			}
		}
	}
}
