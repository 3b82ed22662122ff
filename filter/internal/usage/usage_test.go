package usage

import (
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

var paths = [][]string{{"usage", "total_tokens"}, {"usage", "input_tokens"}, {"usage", "output_tokens"}}

// An OpenAI stream (usage in the last chunk, then [DONE]) and an Anthropic
// one (input tokens first, output tokens last), in any chunking and with
// any line ending.
func TestEvents(t *testing.T) {
	openai := "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		": keep-alive\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\n" +
		"data: [DONE]\n\n"
	anthropic := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	for _, tc := range []struct {
		name, stream string
		paths        [][]string
		want         int64
	}{
		{"openai", openai, paths[:1], 21},
		{"anthropic", anthropic, [][]string{{"message", "usage", "input_tokens"}, {"usage", "output_tokens"}}, 40},
		{"crlf", strings.ReplaceAll(openai, "\n", "\r\n"), paths[:1], 21},
		{"cr", strings.ReplaceAll(openai, "\n", "\r"), paths[:1], 21},
		{"no final blank line", "data: {\"usage\":{\"total_tokens\":7}}", paths[:1], 7},
		{"data over two lines", "data: {\"usage\":\ndata: {\"total_tokens\":8}}\n\n", paths[:1], 8},
	} {
		for _, size := range []int{1, 2, 7, 64, 1 << 20} {
			e := NewEvents(tc.paths)
			for s := tc.stream; len(s) > 0; {
				n := min(size, len(s))
				e.Feed([]byte(s[:n]))
				s = s[n:]
			}
			n, ok, _ := Total(e.End())
			if !ok || n != tc.want {
				t.Errorf("%s in chunks of %d: %d %v, want %d", tc.name, size, n, ok, tc.want)
			}
		}
	}
}

// Broken streams have a defined result: none found, or invalid.
func TestEventsBroken(t *testing.T) {
	for _, tc := range []struct {
		name, stream    string
		found, invalid  bool
		skipped, broken int
	}{
		{"cut before the usage", "data: {\"choices\":[]}\n\ndata: {\"usage\":{\"total", false, false, 0, 1},
		{"no usage at all", "data: {\"x\":1}\n\ndata: [DONE]\n\n", false, false, 0, 0},
		{"negative", "data: {\"usage\":{\"total_tokens\":-5}}\n\n", false, true, 0, 0},
		{"not json", "data: hello\n\n", false, false, 0, 1},
		{"an event past the bound", "data: {\"usage\":{\"total_tokens\":5,\"pad\":\"" + strings.Repeat("x", MaxEvent) + "\"}}\n\n", false, false, 1, 0},
		{"a line past the bound, then usage", "data: " + strings.Repeat("y", 2*MaxEvent) + "\n\ndata: {\"usage\":{\"total_tokens\":3}}\n\n", true, false, 1, 0},
	} {
		e := NewEvents(paths[:1])
		e.Feed([]byte(tc.stream))
		_, ok, invalid := Total(e.End())
		if ok != tc.found || invalid != tc.invalid || e.Skipped != tc.skipped || e.Malformed != tc.broken {
			t.Errorf("%s: found %v invalid %v skipped %d malformed %d", tc.name, ok, invalid, e.Skipped, e.Malformed)
		}
	}
}

// A stream whose event was dropped or unreadable after a path's last value
// is not to be trusted: that event may have carried a later value, or a
// sum's other part (an outsider pushed Anthropic's final message_delta,
// which echoes the client's stop sequence, past the bound: charged its
// input tokens only).
func TestEventsReliable(t *testing.T) {
	start := "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10}}}\n\n"
	delta := func(pad int) string {
		return "data: {\"type\":\"message_delta\",\"delta\":{\"stop_sequence\":\"" + strings.Repeat("x", pad) + "\"},\"usage\":{\"output_tokens\":390}}\n\n"
	}
	sum := [][]string{{"message", "usage", "input_tokens"}, {"usage", "output_tokens"}}
	for _, tc := range []struct {
		name, stream string
		reliable     bool
	}{
		{"whole", start + delta(8) + "data: [DONE]\n\n", true},
		{"the last part past the bound", start + delta(MaxEvent), false},
		{"the last part not JSON", start + "data: {\"usage\":{\"output_tokens\":39\n\n", false},
		{"a dropped event before both parts", "data: " + strings.Repeat("y", 2*MaxEvent) + "\n\n" + start + delta(8), true},
		{"a dropped event between the parts", start + "data: " + strings.Repeat("y", 2*MaxEvent) + "\n\n" + delta(8), false},
		{"nothing found, nothing dropped", "data: {\"x\":1}\n\n", true},
	} {
		e := NewEvents(sum)
		e.Feed([]byte(tc.stream))
		e.End()
		if e.Reliable() != tc.reliable {
			t.Errorf("%s: reliable %v, want %v", tc.name, e.Reliable(), tc.reliable)
		}
	}
}

// A stream is done once it says "[DONE]" after its values: a value after
// it means it was not (an upstream that sent "[DONE]" early and then a
// small usage would have had that taken as final).
func TestEventsDone(t *testing.T) {
	paths := [][]string{{"usage", "total_tokens"}}
	for _, tc := range []struct {
		name, stream string
		done         bool
	}{
		{"done after its usage", "data: {\"usage\":{\"total_tokens\":401}}\n\ndata: [DONE]\n\n", true},
		{"no [DONE]", "data: {\"usage\":{\"total_tokens\":401}}\n\n", false},
		{"a usage after [DONE]", "data: [DONE]\n\ndata: {\"usage\":{\"total_tokens\":5}}\n\n", false},
		{"[DONE] with no space", "data: {\"usage\":{\"total_tokens\":401}}\n\ndata:[DONE]\n\n", true},
		{"[DONE] and more text", "data: {\"usage\":{\"total_tokens\":401}}\n\ndata: [DONE] \n\n", false},
		// Anthropic's and the Responses API's last events (attack 64: an
		// honest client that closed after them paid the rule's 1,000 for
		// 401).
		{"message_stop", "data: {\"usage\":{\"total_tokens\":401}}\n\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{"response.completed", "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\"},\"usage\":{\"total_tokens\":401}}\n\n", true},
		{"a message_stop inside another event", "data: {\"usage\":{\"total_tokens\":401}}\n\ndata: {\"type\":\"delta\",\"text\":\"{\\\"type\\\":\\\"message_stop\\\"}\"}\n\n", false},
	} {
		e := NewEvents(paths)
		e.Feed([]byte(tc.stream))
		e.End()
		if e.Done() != tc.done {
			t.Errorf("%s: done %v, want %v", tc.name, e.Done(), tc.done)
		}
	}
}

// One large event does not leave a stream's buffers large: a stream a
// client holds open keeps what it last needed, at most keepBuffer.
func TestEventsBuffersShrink(t *testing.T) {
	e := NewEvents(paths[:1])
	e.Feed([]byte("data: {\"pad\":\"" + strings.Repeat("x", MaxEvent-64) + "\"}\n\n"))
	e.Feed([]byte("data: {\"usage\":{\"total_tokens\":3}}\n\n"))
	if cap(e.line) > keepBuffer || cap(e.data) > keepBuffer {
		t.Fatalf("buffers kept at %d and %d after the large event", cap(e.line), cap(e.data))
	}
	if n, ok, _ := Total(e.End()); !ok || n != 3 {
		t.Fatalf("%d %v", n, ok)
	}
}

func TestTotal(t *testing.T) {
	if n, ok, _ := Total([]wire.Usage{{Found: true, Valid: true, N: wire.MaxUsage}, {Found: true, Valid: true, N: 5}}); !ok || n != wire.MaxUsage {
		t.Fatalf("sum past the bound: %d", n)
	}
	if n, ok, _ := Total([]wire.Usage{{}, {Found: true, Valid: true, N: 5}}); !ok || n != 5 {
		t.Fatalf("one of two: %d %v", n, ok)
	}
}

// FuzzEvents: any bytes, in any chunking, read the same and within bounds.
func FuzzEvents(f *testing.F) {
	f.Add([]byte("data: {\"usage\":{\"total_tokens\":21}}\r\n\r\ndata: [DONE]\n\n"), uint8(3))
	f.Add([]byte("data:\rdata: {\"usage\":{\"total_tokens\":1.5}}\r\r"), uint8(1))
	f.Fuzz(func(t *testing.T, stream []byte, size uint8) {
		whole := NewEvents(paths)
		whole.Feed(stream)
		want := whole.End()
		parts := NewEvents(paths)
		step := int(size) + 1
		for s := stream; len(s) > 0; {
			n := min(step, len(s))
			parts.Feed(s[:n])
			s = s[n:]
			if cap(parts.line) > 2*MaxEvent || cap(parts.data) > 2*MaxEvent {
				t.Fatalf("buffers grew to %d and %d", cap(parts.line), cap(parts.data))
			}
		}
		got := parts.End()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%q in chunks of %d: %+v, whole %+v", stream, step, got, want)
			}
		}
		if parts.Reliable() != whole.Reliable() {
			t.Fatalf("%q in chunks of %d: reliable %v, whole %v", stream, step, parts.Reliable(), whole.Reliable())
		}
	})
}
