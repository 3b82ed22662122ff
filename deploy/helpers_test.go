package deploy_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var controlsvc struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// controlsvcBinary builds the control service once for the package's tests.
func controlsvcBinary(t *testing.T) string {
	t.Helper()
	controlsvc.once.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-deploy-")
		if err != nil {
			controlsvc.err = err
			return
		}
		controlsvc.path = filepath.Join(dir, "controlsvc")
		build := exec.Command("go", "build", "-o", controlsvc.path, "./cmd/controlsvc")
		build.Dir = "../controlsvc"
		controlsvc.out, controlsvc.err = build.CombinedOutput()
	})
	if controlsvc.err != nil {
		t.Fatalf("build the control service: %v\n%s", controlsvc.err, controlsvc.out)
	}
	return controlsvc.path
}

// freeAddr is a loopback address nothing listens on at the moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// tool finds a Debian package's binary or fails with how to install it.
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: run `make deps` (Debian package %s)", name, pkg)
	}
	return p
}
