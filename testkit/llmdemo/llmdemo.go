// Package llmdemo imitates an OpenAI-compatible chat completions endpoint
// for demos and tests: it answers with a usage object (as JSON, or as
// server-sent events ending with a usage chunk when the request asks for
// one with stream_options.include_usage, as OpenAI does), so that a token
// budget can be seen spent and refused without a model.
package llmdemo

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Path is where the endpoint is served.
const Path = "/v1/chat/completions"

// TokensHeader, on a request, chooses how many completion tokens the answer
// reports (tests pick exact amounts); without it an answer reports
// DefaultCompletionTokens, or max_tokens when smaller.
const TokensHeader = "X-Demo-Completion-Tokens"

// DefaultCompletionTokens is what an answer reports without TokensHeader.
const DefaultCompletionTokens = 400

type request struct {
	Model    string `json:"model"`
	Messages []struct {
		Content string `json:"content"`
	} `json:"messages"`
	MaxTokens     int  `json:"max_tokens"`
	Stream        bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// Handler serves Path.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, `{"error":{"message":"POST a chat completion request"}}`, http.StatusMethodNotAllowed)
			return
		}
		var req request
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			http.Error(w, `{"error":{"message":"the body is not a chat completion request"}}`, http.StatusBadRequest)
			return
		}
		u := usage{CompletionTokens: DefaultCompletionTokens}
		if req.MaxTokens > 0 {
			u.CompletionTokens = min(u.CompletionTokens, int64(req.MaxTokens))
		}
		if v := r.Header.Get(TokensHeader); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				u.CompletionTokens = n
			}
		}
		for _, m := range req.Messages {
			u.PromptTokens += int64(len(m.Content)/4 + 1) // about four characters a token
		}
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
		words := strings.Fields("Rate limits keep a shared API fair for everyone.")
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"id": "chatcmpl-demo", "object": "chat.completion", "model": req.Model,
				"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": strings.Join(words, " ")}, "finish_reason": "stop"}},
				"usage":   u,
			})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		flusher, _ := w.(http.Flusher)
		send := func(v any) {
			b, _ := json.Marshal(v)
			fmt.Fprintf(w, "data: %s\n\n", b)
			if flusher != nil {
				flusher.Flush()
			}
		}
		for _, word := range words {
			send(map[string]any{"id": "chatcmpl-demo", "object": "chat.completion.chunk",
				"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": word + " "}}}})
		}
		if req.StreamOptions.IncludeUsage {
			send(map[string]any{"id": "chatcmpl-demo", "object": "chat.completion.chunk", "choices": []any{}, "usage": u})
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
}
