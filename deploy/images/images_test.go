package images_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/tollgate-rl/tollgate/deploy/images"
)

// built are the real inputs, compiled once: the filter module and a static
// linux/amd64 control service.
var built struct{ wasm, controlsvc, config string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tollgate-images-")
	if err != nil {
		panic(err)
	}
	built.wasm, built.controlsvc = filepath.Join(dir, "tollgate.wasm"), filepath.Join(dir, "controlsvc")
	built.config, _ = filepath.Abs("../../controlsvc/tollgate.example.toml")
	for _, c := range []*exec.Cmd{
		exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", built.wasm, "."),
		exec.Command("go", "build", "-trimpath", "-o", built.controlsvc, "./cmd/controlsvc"),
	} {
		c.Env = append(os.Environ(), "CGO_ENABLED=0")
		if strings.HasSuffix(c.Args[len(c.Args)-1], ".") {
			c.Dir, c.Env = "../../filter", append(c.Env, "GOOS=wasip1", "GOARCH=wasm")
		} else {
			c.Dir, c.Env = "../../controlsvc", append(c.Env, "GOOS=linux", "GOARCH=amd64")
		}
		if out, err := c.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			panic(string(out))
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var meta = images.Meta{Version: "1.2.3", Revision: "abc123", Source: "https://github.com/tollgate-rl/tollgate", Licenses: "NOASSERTION", Created: time.Unix(1_700_000_000, 0)}

func read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeAndReadBack writes img as a layout and reads the one image back from
// it, checking every digest and size on the way.
func writeAndReadBack(t *testing.T, img v1.Image, name string) (v1.Image, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := images.Write(dir, "ghcr.io/tollgate-rl/"+name, meta.Version, img); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != meta.Version {
		t.Fatalf("index %+v, %v: want one image named %s", im, err, meta.Version)
	}
	back, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(back); err != nil {
		t.Fatalf("the image read back does not validate: %v", err)
	}
	// The tarball holds the same image.
	fromTar, err := tarball.ImageFromPath(dir+".tar", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(fromTar); err != nil {
		t.Fatalf("the tarball does not validate: %v", err)
	}
	return back, dir
}

// files extracts an image's filesystem: path -> (mode, bytes).
func files(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		h.PAXRecords = map[string]string{"data": string(b)}
		out[strings.TrimPrefix(h.Name, "./")] = h
	}
}

func data(h *tar.Header) []byte { return []byte(h.PAXRecords["data"]) }

// The filter's image is the compat variant both Istio and Envoy Gateway
// pull: an OCI manifest, one layer, holding plugin.wasm byte for byte.
func TestWasmImage(t *testing.T) {
	module := read(t, built.wasm)
	img, err := images.Wasm(module, meta)
	if err != nil {
		t.Fatal(err)
	}
	back, dir := writeAndReadBack(t, img, "tollgate-filter")
	m, err := back.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Fatalf("manifest %+v: want an OCI manifest with one OCI layer", m)
	}
	if m.Annotations["org.opencontainers.image.version"] != "1.2.3" {
		t.Fatalf("manifest annotations %v", m.Annotations)
	}
	fs := files(t, back)
	if len(fs) != 1 || fs[images.WasmFile] == nil || !bytes.Equal(data(fs[images.WasmFile]), module) {
		t.Fatalf("layer holds %d files; want plugin.wasm equal to the built module", len(fs))
	}
	skopeo(t, "oci:"+dir+":"+meta.Version, back)
	skopeo(t, "docker-archive:"+dir+".tar", back)
	umoci(t, dir, images.WasmFile, false)
}

// The control service's image: the binary, runnable, and its config; a
// non-root user; no shell; the OCI labels.
func TestControlServiceImage(t *testing.T) {
	bin, config := read(t, built.controlsvc), read(t, built.config)
	img, err := images.ControlService(bin, config, meta)
	if err != nil {
		t.Fatal(err)
	}
	back, dir := writeAndReadBack(t, img, "tollgate-controlsvc")
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != images.BinaryPath || strings.Join(c.Cmd, " ") != "-config "+images.ConfigPath ||
		cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Fatalf("config %+v", cf)
	}
	for k, want := range map[string]string{"org.opencontainers.image.source": meta.Source, "org.opencontainers.image.version": "1.2.3",
		"org.opencontainers.image.revision": "abc123", "org.opencontainers.image.licenses": "NOASSERTION", "org.opencontainers.image.created": "2023-11-14T22:13:20Z"} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	fs := files(t, back)
	// Exactly these files, root-owned and read-only: no shell, no tools.
	var regular []string
	for name, h := range fs {
		if h.Typeflag == tar.TypeReg {
			regular = append(regular, name)
			if h.Uid != 0 || h.Mode&0o222 != 0 {
				t.Errorf("%s: uid %d, mode %o; want root-owned, read-only", name, h.Uid, h.Mode)
			}
		}
	}
	slices.Sort(regular)
	if got := strings.Join(regular, " "); got != "etc/group etc/passwd etc/tollgate/tollgate.toml usr/local/bin/controlsvc" {
		t.Fatalf("files in the image: %s", got)
	}
	b := fs[strings.TrimPrefix(images.BinaryPath, "/")]
	if b == nil || b.Mode&0o111 == 0 || b.Mode&0o222 != 0 || !bytes.Equal(data(b), bin) {
		t.Fatalf("binary in the image: %+v", b)
	}
	if cfg := fs[strings.TrimPrefix(images.ConfigPath, "/")]; cfg == nil || !bytes.Equal(data(cfg), config) {
		t.Fatal("config missing from the image")
	}
	if !strings.Contains(string(data(fs["etc/passwd"])), "nonroot:x:65532:65532") {
		t.Fatal("no nonroot user in /etc/passwd")
	}
	// The binary, taken out of the image, runs and accepts its config.
	root := t.TempDir()
	for _, p := range []string{images.BinaryPath, images.ConfigPath} {
		dst := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if err := os.WriteFile(dst, data(fs[strings.TrimPrefix(p, "/")]), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(root, images.BinaryPath), "-config", filepath.Join(root, images.ConfigPath), "-check-config")
	cmd.Env = []string{"PATH=/nonexistent"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the image's binary -check-config: %v\n%s", err, out)
	}
	skopeo(t, "oci:"+dir+":"+meta.Version, back)
	umoci(t, dir, images.BinaryPath, true)
}

// skopeo reads the image as a registry client would and sees its digest.
func skopeo(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	bin, err := exec.LookPath("skopeo")
	if err != nil {
		t.Fatal("skopeo is not installed: run `make deps` (Debian package skopeo)")
	}
	out, err := exec.Command(bin, "inspect", "--raw", ref).CombinedOutput()
	if err != nil {
		t.Fatalf("skopeo inspect %s: %v\n%s", ref, err, out)
	}
	var m v1.Manifest
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("skopeo's manifest: %v\n%s", err, out)
	}
	want, _ := img.ConfigName()
	if m.Config.Digest != want {
		t.Fatalf("skopeo reads config %s, want %s", m.Config.Digest, want)
	}
}

// umoci unpacks the layout's filesystem and finds want in it; a linux
// image also becomes a runtime bundle (umoci makes no runtime config for
// another OS).
func umoci(t *testing.T, dir, want string, bundle bool) {
	t.Helper()
	bin, err := exec.LookPath("umoci")
	if err != nil {
		t.Fatal("umoci is not installed: run `make deps` (Debian package umoci)")
	}
	out := filepath.Join(t.TempDir(), "unpacked")
	args := []string{"raw", "unpack", "--rootless", "--image", dir + ":" + meta.Version, out}
	root := out
	if bundle {
		args, root = []string{"unpack", "--rootless", "--image", dir + ":" + meta.Version, out}, filepath.Join(out, "rootfs")
	}
	if b, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("umoci %v: %v\n%s", args, err, b)
	}
	if _, err := os.Stat(filepath.Join(root, want)); err != nil {
		t.Fatalf("umoci's unpacked image lacks %s: %v", want, err)
	}
	if _, err := os.Stat(filepath.Join(out, "config.json")); bundle && err != nil {
		t.Fatalf("umoci made no runtime config: %v", err)
	}
}
