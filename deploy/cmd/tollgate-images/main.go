// Command tollgate-images writes Tollgate's OCI images (make images): the
// filter's Wasm image and the control service's image, each as an OCI
// image layout under -out and a tarball beside it.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tollgate-rl/tollgate/deploy/images"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		slog.Error("images", "err", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("tollgate-images", flag.ContinueOnError)
	wasm := fs.String("wasm", "build/tollgate.wasm", "the filter module")
	bin := fs.String("controlsvc", "build/controlsvc-linux-amd64", "the control service, statically linked for linux/amd64")
	cfg := fs.String("config", "controlsvc/tollgate.example.toml", "the control service's example configuration")
	out := fs.String("out", "build/images", "where the layouts and tarballs go")
	repo := fs.String("repository", "ghcr.io/tollgate-rl", "the images' repository, in their names")
	version := fs.String("version", "dev", "image tag and version label")
	revision := fs.String("revision", "", "source revision label (a commit)")
	licenses := fs.String("licenses", "NOASSERTION", "SPDX licence expression label (the repository states none yet)")
	created := fs.Int64("created", 0, "creation time, Unix seconds (0: the epoch, reproducible)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m := images.Meta{Version: *version, Revision: *revision, Source: "https://github.com/tollgate-rl/tollgate", Licenses: *licenses,
		Created: time.Unix(*created, 0)}
	module, err := os.ReadFile(*wasm)
	if err != nil {
		return fmt.Errorf("read the filter: %w", err)
	}
	binary, err := os.ReadFile(*bin)
	if err != nil {
		return fmt.Errorf("read the control service: %w", err)
	}
	config, err := os.ReadFile(*cfg)
	if err != nil {
		return fmt.Errorf("read the config: %w", err)
	}
	filter, err := images.Wasm(module, m)
	if err != nil {
		return err
	}
	svc, err := images.ControlService(binary, config, m)
	if err != nil {
		return err
	}
	if err := images.Write(filepath.Join(*out, "tollgate-filter"), *repo+"/tollgate-filter", *version, filter); err != nil {
		return err
	}
	if err := images.Write(filepath.Join(*out, "tollgate-controlsvc"), *repo+"/tollgate-controlsvc", *version, svc); err != nil {
		return err
	}
	for _, n := range []string{"tollgate-filter", "tollgate-controlsvc"} {
		fmt.Printf("oci:%s/%s:%s  (and %s/%s.tar for docker load)\n", *out, n, *version, *out, n)
	}
	return nil
}
