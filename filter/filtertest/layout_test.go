package filtertest

import (
	"os/exec"
	"strings"
	"testing"
)

// The filter module's layout holds: the guest (what ships in Envoy) and the
// binding import nothing of the development host, and the binding's test
// kit runs on the host model, not on the wazero host. Checked on the real
// import graph (go list), for the guest as it is built: wasip1.
func TestImportsGoOneWay(t *testing.T) {
	const mod = "github.com/tollgate-rl/tollgate/filter"
	for _, tt := range []struct {
		goos      string
		pkgs      []string
		forbidden []string
	}{
		{"wasip1", []string{mod, mod + "/internal/...", mod + "/pluginconf", mod + "/proxywasm"},
			[]string{mod + "/devhost", mod + "/proxywasm/hostmodel", mod + "/proxywasm/proxytest", "github.com/tetratelabs/wazero"}},
		{"", []string{mod + "/proxywasm/...", mod + "/pluginconf"},
			[]string{mod + "/devhost", "github.com/tetratelabs/wazero"}},
	} {
		cmd := exec.Command("go", append([]string{"list", "-deps"}, tt.pkgs...)...)
		if tt.goos != "" {
			cmd.Env = append(cmd.Environ(), "GOOS="+tt.goos, "GOARCH=wasm")
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list %v: %v\n%s", tt.pkgs, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 5 {
			t.Fatalf("go list %v listed %d packages: %s", tt.pkgs, len(deps), out)
		}
		for _, d := range deps {
			for _, f := range tt.forbidden {
				if d == f || strings.HasPrefix(d, f+"/") {
					t.Errorf("%v (GOOS=%s) imports %s", tt.pkgs, tt.goos, d)
				}
			}
		}
	}
}
