// Command image writes kvgate's container image as an OCI image layout, without pulling a base image: one
// layer on an empty base (go-containerregistry), holding the static kvgate binary, the demo model's
// tokenizer files and a default configuration. `make image` runs it.
//
//	go run ./image --binary ../bin/kvgate-static --model ../examples/models/qwen3 --config image/kvgate.yaml --out ../bin/kvgate-oci
//
// The image (one linux platform, the binary's): entrypoint ["/usr/local/bin/kvgate", "serve"], command
// ["--config", "/etc/kvgate/kvgate.yaml"], user 65532:65532 (no root), port 8080/tcp, XDG_CACHE_HOME=/tmp
// (the compiled-policy cache), files:
//
//	/usr/local/bin/kvgate                  0755
//	/etc/kvgate/kvgate.yaml                0644 (--config)
//	/etc/kvgate/models/qwen3/<files>       0644 (--model's regular files)
//	/tmp                                   1777
//
// Every file has the same modification time (the Unix epoch), so the same inputs give the same digests.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Paths inside the image.
const (
	BinaryPath = "/usr/local/bin/kvgate"
	ConfigPath = "/etc/kvgate/kvgate.yaml"
	ModelsDir  = "/etc/kvgate/models"
	// RefName is the layout's org.opencontainers.image.ref.name annotation (skopeo's oci:DIR:kvgate).
	RefName = "kvgate"
	// User is the image's numeric user and group (no root; "nonroot" in distroless terms).
	User = "65532:65532"
)

// Options are the image's inputs.
type Options struct {
	Binary string // the static kvgate binary
	Model  string // a model directory (its regular files are copied into ModelsDir/<base name>)
	Config string // the default configuration file
	Arch   string // GOARCH the binary was built for ("amd64")
}

type file struct {
	name string // path in the image, without the leading "/"
	mode int64
	data []byte
}

// layerTar returns the layer's tar: directories first, then the files, sorted, with fixed times and owners.
func layerTar(o Options) ([]byte, error) {
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile(o.Config)
	if err != nil {
		return nil, err
	}
	files := []file{{BinaryPath[1:], 0o755, bin}, {ConfigPath[1:], 0o644, cfg}}
	entries, err := os.ReadDir(o.Model)
	if err != nil {
		return nil, err
	}
	model := filepath.Base(o.Model)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(o.Model, e.Name()))
		if err != nil {
			return nil, err
		}
		files = append(files, file{ModelsDir[1:] + "/" + model + "/" + e.Name(), 0o644, b})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	dirs := []string{"etc/", "etc/kvgate/", "etc/kvgate/models/", "etc/kvgate/models/" + model + "/", "tmp/", "usr/", "usr/local/", "usr/local/bin/"}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0).UTC()
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)),
			ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Build returns the image.
func Build(o Options) (v1.Image, error) {
	tb, err := layerTar(o)
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tb)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{CreatedBy: "kvgate deploy/image", Created: v1.Time{Time: time.Unix(0, 0).UTC()}}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", o.Arch
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint = []string{BinaryPath, "serve"}
	cf.Config.Cmd = []string{"--config", ConfigPath}
	cf.Config.User = User
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"XDG_CACHE_HOME=/tmp"}
	cf.Config.ExposedPorts = map[string]struct{}{"8080/tcp": {}}
	cf.Config.Labels = map[string]string{"org.opencontainers.image.title": "kvgate",
		"org.opencontainers.image.description": "KV-cache-aware OpenAI-compatible LLM gateway"}
	return mutate.ConfigFile(img, cf)
}

// WriteLayout writes img as an OCI image layout in dir (replacing what was there), tagged RefName.
func WriteLayout(dir string, img v1.Image) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": RefName}))
}

func main() {
	var o Options
	var out string
	flag.StringVar(&o.Binary, "binary", "", "the static kvgate binary (CGO_ENABLED=0)")
	flag.StringVar(&o.Model, "model", "", "model directory to include (tokenizer files)")
	flag.StringVar(&o.Config, "config", "image/kvgate.yaml", "default configuration file")
	flag.StringVar(&o.Arch, "arch", "amd64", "GOARCH of the binary")
	flag.StringVar(&out, "out", "", "OCI layout directory to write")
	flag.Parse()
	if o.Binary == "" || o.Model == "" || out == "" {
		fmt.Fprintln(os.Stderr, "usage: image --binary FILE --model DIR --out DIR [--config FILE] [--arch amd64]")
		os.Exit(2)
	}
	img, err := Build(o)
	if err == nil {
		err = WriteLayout(out, img)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	d, _ := img.Digest()
	fmt.Printf("wrote %s (oci:%s:%s, %s)\n", out, out, RefName, d)
}
