// Package usage reads what an upstream's response says a request cost (an
// LLM API's token usage): from a JSON body, or from the server-sent events
// of a streamed answer, where the usage arrives in the last event that
// carries it. Every read is bounded.
package usage

import (
	"bytes"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Total sums what the paths found: ok is false when none was found, or
// one was found but is no number of 0 or more (invalid is then true).
func Total(us []wire.Usage) (n int64, ok, invalid bool) {
	found := false
	for _, u := range us {
		if !u.Found {
			continue
		}
		if !u.Valid {
			return 0, false, true
		}
		found = true
		n = min(n+u.N, wire.MaxUsage)
	}
	return n, found, false
}

// MaxEvent bounds one event's data: a longer event is skipped (a usage
// event is a few hundred bytes).
const MaxEvent = 64 << 10

// Events reads a text/event-stream fed in chunks as they pass. For each
// path it keeps the value of the last event whose JSON data carried it
// (Anthropic sends input tokens first and output tokens last; OpenAI all
// of them in its last chunk). Memory is bounded by MaxEvent.
type Events struct {
	paths [][]string
	last  []wire.Usage
	line  []byte // the line being read, across chunks
	data  []byte // the event being read: its data lines joined by "\n"
	// skipping: the line or event passed MaxEvent and is dropped whole.
	skipLine, skipEvent bool
	cr                  bool // the last byte was '\r' (a "\r\n" follows, or not)
	scratch             []wire.Usage
	// Skipped counts events dropped for their size; Malformed events whose
	// data was not JSON ("[DONE]" is not counted).
	Skipped, Malformed int
	// events counts the events read, badAt is the last of them dropped or
	// malformed (0: none), foundAt the one each path's value came from.
	events, badAt int
	foundAt       []int
	// done: the stream said it was finished (OpenAI's "[DONE]").
	done bool
}

// NewEvents reads the values at paths.
func NewEvents(paths [][]string) *Events {
	return &Events{paths: paths, last: make([]wire.Usage, len(paths)), scratch: make([]wire.Usage, len(paths)), foundAt: make([]int, len(paths))}
}

// Feed reads the next chunk of the stream.
func (e *Events) Feed(chunk []byte) {
	for len(chunk) > 0 {
		if e.cr && chunk[0] == '\n' {
			chunk = chunk[1:] // the "\n" of a "\r\n" already ended the line
			e.cr = false
			continue
		}
		e.cr = false
		i := bytes.IndexAny(chunk, "\r\n")
		if i < 0 {
			e.addToLine(chunk)
			return
		}
		e.addToLine(chunk[:i])
		e.cr = chunk[i] == '\r'
		chunk = chunk[i+1:]
		e.endLine()
	}
}

func (e *Events) addToLine(b []byte) {
	if e.skipLine {
		return
	}
	if len(e.line)+len(b) > MaxEvent {
		e.skipLine, e.line = true, e.line[:0]
		return
	}
	e.line = append(e.line, b...)
}

// keepBuffer is the most a stream's buffers keep between events: one large
// event grows them up to MaxEvent, and a stream held open by its client
// would keep that (an outsider held 400 such streams: 100 MB).
const keepBuffer = 4 << 10

// endLine handles a whole line: a field, a comment, or the blank line
// that dispatches the event.
func (e *Events) endLine() {
	line, skipped := e.line, e.skipLine
	e.line, e.skipLine = e.line[:0], false
	if cap(line) > keepBuffer {
		e.line = nil // line is read below; the next line gets a new one
	}
	if skipped {
		e.skipEvent = true
		return
	}
	if len(line) == 0 {
		e.dispatch()
		return
	}
	name, value, _ := bytes.Cut(line, []byte(":"))
	if string(name) != "data" {
		return // a comment (":..."), event:, id:, retry:
	}
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	if e.skipEvent || len(e.data)+len(value)+1 > MaxEvent {
		e.skipEvent, e.data = true, e.data[:0]
		return
	}
	if len(e.data) > 0 {
		e.data = append(e.data, '\n')
	}
	e.data = append(e.data, value...)
}

// dispatch reads the event's data, if it is JSON, for the paths.
func (e *Events) dispatch() {
	data, skipped := e.data, e.skipEvent
	e.data, e.skipEvent = e.data[:0], false
	if cap(data) > keepBuffer {
		e.data = nil
	}
	switch {
	case skipped:
		e.events++
		e.Skipped, e.badAt = e.Skipped+1, e.events
		return
	case string(data) == "[DONE]":
		e.done = true
		return
	case len(data) == 0:
		return
	}
	e.events++
	for i := range e.scratch {
		e.scratch[i] = wire.Usage{}
	}
	if err := wire.ReadUsage(data, e.paths, e.scratch); err != nil {
		e.Malformed, e.badAt = e.Malformed+1, e.events
		return
	}
	for i, u := range e.scratch {
		if u.Found {
			// A value after "[DONE]": the stream was not done.
			e.last[i], e.foundAt[i], e.done = u, e.events, false
		}
	}
	if final(data) {
		e.done = true
	}
}

// final reports whether an event's data is an API's own last event, after
// which its usage is whole: Anthropic's message_stop, the OpenAI Responses
// API's response.completed (which carries it). Each API writes its event's
// type first; a client's text inside an event is a JSON string, its quotes
// escaped, so it cannot begin one.
func final(data []byte) bool {
	return bytes.HasPrefix(data, []byte(`{"type":"message_stop"`)) || bytes.HasPrefix(data, []byte(`{"type":"response.completed"`))
}

// Reliable reports whether what End returns can be trusted: no event was
// dropped (past MaxEvent) or unreadable after the last value of any path,
// since that event may have carried a later value, or the missing part of
// a sum. An answer's last event may echo what the client sent (Anthropic's
// final message_delta carries the stop sequence that matched): a client
// that could push it past the bound would otherwise be charged its input
// tokens only.
func (e *Events) Reliable() bool {
	for _, at := range e.foundAt {
		if e.badAt > at {
			return false
		}
	}
	return true
}

// Done reports whether the stream said it was finished ("[DONE]"): what
// the paths found before it is its usage, whether or not the connection
// then ends cleanly.
func (e *Events) Done() bool { return e.done }

// End finishes the stream (an event not closed by a blank line is
// dispatched, as a stream's end does) and returns what the paths found.
func (e *Events) End() []wire.Usage {
	if len(e.line) > 0 || e.skipLine {
		e.endLine()
	}
	if len(e.data) > 0 || e.skipEvent {
		e.dispatch()
	}
	return e.last
}
