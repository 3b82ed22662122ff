// Command demo-upstream is the API that `make run` puts behind the gateway:
// it answers every request with what it was told by the filter (the
// x-tollgate-* headers), so a curl shows the whole path; and it imitates an
// OpenAI-compatible chat endpoint at /v1/chat/completions (llmdemo), so a
// token budget can be seen spent and refused.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/llmdemo"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	flag.Parse()
	mux := http.NewServeMux()
	mux.Handle(llmdemo.Path, llmdemo.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		seen := map[string]string{}
		for k, v := range r.Header {
			if strings.HasPrefix(strings.ToLower(k), "x-tollgate-") {
				seen[strings.ToLower(k)] = strings.Join(v, ",")
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"method": r.Method, "path": r.URL.Path, "upstream_saw": seen})
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "demo-upstream:", err)
		os.Exit(1)
	}
}
