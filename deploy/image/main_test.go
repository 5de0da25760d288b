package main

import (
	"archive/tar"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// The image is built from the static kvgate binary on an empty base and read back: by skopeo (Debian's,
// `skopeo inspect --config oci:DIR:kvgate`) and by go-containerregistry's layout reader. One layer holding
// the binary (byte-identical, mode 0755), the default config and the demo model; entrypoint, command,
// non-root user, port and platform as written; the binary is statically linked (no ELF interpreter).
func TestImageReadBack(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvgate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/kvgate") // as `make image` builds it (shared build cache)
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the binary is dynamically linked (program header %v)", p.Type)
		}
	}
	ef.Close()
	model := "../../examples/models/qwen3"
	img, err := Build(Options{Binary: bin, Model: model, Config: "kvgate.yaml", Arch: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "oci")
	if err := WriteLayout(out, img); err != nil {
		t.Fatal(err)
	}

	// skopeo reads the layout as an OCI image.
	skopeo := testenv.Command(t, "skopeo")
	raw, err := exec.Command(skopeo, "inspect", "--config", "oci:"+out+":"+RefName).Output()
	if err != nil {
		var ee *exec.ExitError
		errors.As(err, &ee)
		t.Fatalf("skopeo inspect --config: %v\n%s", err, ee.Stderr)
	}
	var oc struct {
		Architecture, OS string
		Config           struct {
			User         string
			Entrypoint   []string
			Cmd          []string
			Env          []string
			ExposedPorts map[string]struct{}
			WorkingDir   string
		} `json:"config"`
		RootFS struct {
			Type    string   `json:"type"`
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(raw, &oc); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if oc.OS != "linux" || oc.Architecture != runtime.GOARCH || oc.Config.User != "65532:65532" ||
		!slices.Equal(oc.Config.Entrypoint, []string{"/usr/local/bin/kvgate", "serve"}) ||
		!slices.Equal(oc.Config.Cmd, []string{"--config", "/etc/kvgate/kvgate.yaml"}) ||
		!slices.Contains(oc.Config.Env, "XDG_CACHE_HOME=/tmp") || len(oc.Config.ExposedPorts) != 1 ||
		oc.RootFS.Type != "layers" || len(oc.RootFS.DiffIDs) != 1 {
		t.Fatalf("skopeo config: %s", raw)
	}
	raw, err = exec.Command(skopeo, "inspect", "oci:"+out+":"+RefName).Output()
	if err != nil {
		t.Fatalf("skopeo inspect: %v", err)
	}
	var meta struct {
		Layers []string
		Os     string
	}
	if err := json.Unmarshal(raw, &meta); err != nil || len(meta.Layers) != 1 || meta.Os != "linux" {
		t.Fatalf("skopeo inspect: %v %s", err, raw)
	}

	// go-containerregistry reads the same layout; the one layer holds exactly the files written.
	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != RefName ||
		im.Manifests[0].MediaType != types.OCIManifestSchema1 {
		t.Fatalf("index: %v %+v", err, im)
	}
	back, err := p.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %v %d", err, len(layers))
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Fatalf("layer media type %s", mt)
	}
	if d, _ := layers[0].DiffID(); "sha256:"+d.Hex != oc.RootFS.DiffIDs[0] {
		t.Fatalf("diff ID %v, skopeo %s", d, oc.RootFS.DiffIDs[0])
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want := map[string]string{"usr/local/bin/kvgate": bin, "etc/kvgate/kvgate.yaml": "kvgate.yaml",
		"etc/kvgate/models/qwen3/tokenizer.json.gz":     model + "/tokenizer.json.gz",
		"etc/kvgate/models/qwen3/tokenizer_config.json": model + "/tokenizer_config.json"}
	tr := tar.NewReader(rc)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "tmp/" && h.Mode != 0o1777 {
			t.Fatalf("/tmp mode %o", h.Mode)
		}
		src, ok := want[h.Name]
		if !ok {
			continue
		}
		got, _ := io.ReadAll(tr)
		exp, _ := os.ReadFile(src)
		if string(got) != string(exp) {
			t.Fatalf("%s differs from %s (%d vs %d bytes)", h.Name, src, len(got), len(exp))
		}
		if h.Name == "usr/local/bin/kvgate" && h.Mode != 0o755 {
			t.Fatalf("binary mode %o", h.Mode)
		}
		seen[h.Name] = true
	}
	if len(seen) != len(want) {
		t.Fatalf("layer has %v of %v", seen, want)
	}
}
