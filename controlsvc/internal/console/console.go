// Package console serves the operator's console: static files embedded in
// the binary (no CDN, no build step), a page that signs in with the admin
// token and does everything through the admin API a curl user has. Every
// answer carries a strict Content-Security-Policy: scripts and styles from
// this origin only (none inline), no frames, no other origin to talk to.
package console

import (
	"bytes"
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// types are the console's files' content types.
var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

//go:embed assets
var assets embed.FS

// Prefix is where the console is served.
const Prefix = "/console/"

// Policy is the console's Content-Security-Policy.
const Policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// Handler serves the console's files under Prefix.
func Handler() http.Handler {
	files, _ := fs.Sub(assets, "assets") // the embedded tree always has it
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", Policy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name := strings.TrimPrefix(path.Clean(r.URL.Path), strings.TrimSuffix(Prefix, "/"))
		if name == "" || name == "/" {
			name = "/index.html"
		}
		b, err := fs.ReadFile(files, strings.TrimPrefix(name, "/"))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		if t, ok := types[path.Ext(name)]; ok {
			h.Set("Content-Type", t)
		}
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	})
}
