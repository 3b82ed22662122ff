// Package images builds Tollgate's OCI images from files on disk, with
// go-containerregistry: the filter as a Wasm image that Istio's WasmPlugin
// and Envoy Gateway's EnvoyExtensionPolicy pull, and the control service as
// a minimal image (one static binary, its example configuration, a non-root
// user, no shell).
package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the control service's image keeps its files, and who runs it: the
// conventional "nonroot" ids of distroless images, so that a cluster's
// runAsNonRoot policy accepts the image as it is.
const (
	BinaryPath = "/usr/local/bin/controlsvc"
	ConfigPath = "/etc/tollgate/tollgate.toml"
	NonRootUID = 65532
	WasmFile   = "plugin.wasm" // the one file of a compat Wasm image
)

// Meta are the labels every image carries (OCI image annotations keys).
type Meta struct {
	Version, Revision, Source, Licenses string
	// Created is the images' creation time; a fixed one (the commit's)
	// keeps builds reproducible.
	Created time.Time
}

func (m Meta) labels(title, description string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.version":     m.Version,
		"org.opencontainers.image.revision":    m.Revision,
		"org.opencontainers.image.source":      m.Source,
		"org.opencontainers.image.licenses":    m.Licenses,
		"org.opencontainers.image.created":     m.Created.UTC().Format(time.RFC3339),
	}
}

// file is one file of a layer.
type file struct {
	name string // absolute path in the image
	data []byte
	mode fs.FileMode
}

// layer stages files in a temporary directory with their modes and lets
// archive/tar's AddFS write them (root-owned, readable by the image's user).
func layer(files ...file) (v1.Layer, error) {
	dir, err := os.MkdirTemp("", "tollgate-layer-")
	if err != nil {
		return nil, fmt.Errorf("stage layer: %w", err)
	}
	defer os.RemoveAll(dir)
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+f.name)))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, fmt.Errorf("stage %s: %w", f.name, err)
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return nil, fmt.Errorf("stage %s: %w", f.name, err)
		}
		if err := os.Chmod(p, f.mode); err != nil { // past the umask
			return nil, fmt.Errorf("stage %s: %w", f.name, err)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// base is an empty OCI image (not Docker's media types).
func base() v1.Image {
	return mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1)
}

// Wasm is the filter's image in the Wasm image spec's compat variant: an
// OCI image whose single layer holds plugin.wasm. Istio (WasmPlugin) and
// Envoy Gateway (EnvoyExtensionPolicy, type Image) both pull this variant.
func Wasm(module []byte, m Meta) (v1.Image, error) {
	l, err := layer(file{name: WasmFile, data: module, mode: 0o444})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(base(), l)
	if err != nil {
		return nil, fmt.Errorf("wasm image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("wasm image: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Created = "wasi", "wasm", v1.Time{Time: m.Created} // Docker's name for Wasm images
	cfg.Config.Labels = m.labels("tollgate-filter", "Tollgate's proxy-wasm rate limit filter for Envoy (plugin.wasm)")
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("wasm image: %w", err)
	}
	return mutate.Annotations(img, cfg.Config.Labels).(v1.Image), nil
}

// passwd names the non-root user, so that tools reading the image (and the
// process's own user look-ups) find one.
var passwd = fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootUID, NonRootUID)

// ControlService is the control service's image: binary (statically
// linked, linux/amd64) and the example config, run as the non-root user,
// with nothing else: no shell, no package manager.
func ControlService(binary, config []byte, m Meta) (v1.Image, error) {
	l, err := layer(
		file{name: BinaryPath, data: binary, mode: 0o555},
		file{name: ConfigPath, data: config, mode: 0o444},
		file{name: "/etc/passwd", data: []byte(passwd), mode: 0o444},
		file{name: "/etc/group", data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", NonRootUID), mode: 0o444},
	)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(base(), l)
	if err != nil {
		return nil, fmt.Errorf("control service image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("control service image: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Created = "linux", "amd64", v1.Time{Time: m.Created}
	cfg.Config.Entrypoint = []string{BinaryPath}
	cfg.Config.Cmd = []string{"-config", ConfigPath}
	cfg.Config.User = fmt.Sprintf("%d:%d", NonRootUID, NonRootUID)
	cfg.Config.WorkingDir = "/"
	cfg.Config.ExposedPorts = map[string]struct{}{"8081/tcp": {}, "8082/tcp": {}}
	cfg.Config.Labels = m.labels("tollgate-controlsvc", "Tollgate's control service: the rate limit decisions, admin API and metrics")
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("control service image: %w", err)
	}
	return mutate.Annotations(img, cfg.Config.Labels).(v1.Image), nil
}

// Write saves img as an OCI image layout in dir (replacing what was there),
// its index naming it tag (oci:DIR:TAG for skopeo and umoci), and as a
// tarball next to it (dir + ".tar", named repository:tag, the format
// `docker load` and skopeo's docker-archive: read).
func Write(dir, repository, tag string, img v1.Image) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("write %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write %s: %w", dir, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
		return fmt.Errorf("write %s: %w", dir, err)
	}
	ref, err := name.NewTag(repository + ":" + tag)
	if err != nil {
		return fmt.Errorf("write %s: image name: %w", dir, err)
	}
	if err := tarball.WriteToFile(dir+".tar", ref, img); err != nil {
		return fmt.Errorf("write %s.tar: %w", dir, err)
	}
	return nil
}
