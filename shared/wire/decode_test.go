package wire

import (
	"encoding/json"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"math"
	"reflect"
	"testing"
)

var sampleDecision = CheckResponse{Allowed: true, Limit: 100, Remaining: 42, ResetAt: 1_800_000_060, RetryAfter: 0,
	Strategy: "token_bucket", WindowSeconds: 60, RuleID: "tier_free", Lease: Lease{Granted: 9, TTLMs: 1000, ChargeGranted: 4500, LeasedAt: 1795676400000000, ChargeLeasedAt: 1795676000000000},
	Identity: "user:ali\"ce\\ \u00e9 \U0001F600", Tier: "free", Degraded: true, LogOnly: true,
	Refusal: &rules.Response{Status: 403, Body: `{"e":"{{retry_after}}"}`, Headers: map[string]string{"x-a": "1", "content-type": "text/plain"}},
	Charges: []Charge{{RuleID: "llm", CostFrom: "response_json:usage.total_tokens", Reserved: 4095, ReservedAt: 1795676400000001}, {RuleID: "x\u00e9", CostFrom: "response_header:x-usage"}}}

func TestDecodeCheckResponseRoundTrip(t *testing.T) {
	for _, d := range []CheckResponse{sampleDecision, {}, {Limit: math.MaxInt64, Remaining: math.MinInt64, RuleID: "\x01\n\t</>&"}} {
		b, _ := json.Marshal(d)
		var got CheckResponse
		if err := DecodeCheckResponse(b, &got); err != nil || !reflect.DeepEqual(got, d) {
			t.Fatalf("%s:\n got %+v, %v\nwant %+v", b, got, err, d)
		}
	}
	// The 429 body carries the seed 003 envelope beside the decision: skipped.
	denied := `{"allowed":false,"limit":5,"retry_after":12,"error":{"code":"RATE_LIMIT_EXCEEDED","details":{"limit":5,"reset_at":"x","n":[1,2.5e3,null,true]}}}`
	var d CheckResponse
	if err := DecodeCheckResponse([]byte(denied), &d); err != nil || d.Allowed || d.Limit != 5 || d.RetryAfter != 12 {
		t.Fatalf("denied body: %+v, %v", d, err)
	}
}

func TestDecodeCheckResponseRefuses(t *testing.T) {
	for _, b := range []string{``, `null`, `{`, `{"limit":1.5}`, `{"limit":"5"}`, `{"limit":01}`, `{"allowed":tru}`,
		`{"tier":"a` + "\x01" + `"}`, `{"tier":"\x"}`, `{} x`, `{"a":[1,}`, `{"limit":99999999999999999999}`, "{\"K\u212aey\":1}"} {
		var d CheckResponse
		if err := DecodeCheckResponse([]byte(b), &d); err == nil {
			t.Errorf("%q accepted: %+v", b, d)
		}
	}
}

// FuzzDecodeCheckResponse holds the decoder to encoding/json: whatever it
// accepts, encoding/json accepts too, with the same result.
func FuzzDecodeCheckResponse(f *testing.F) {
	b, _ := json.Marshal(sampleDecision)
	f.Add(b)
	f.Add([]byte(`{"ALLOWED":true,"lease":null,"x":{"y":[{}]},"tier":"\ud83d\ude00 \ud800"}`))
	f.Add([]byte(`{"limit":-0,"rule_id":null}`))
	f.Add([]byte(`{"refusal":{"status":429,"headers":{"a":"b","a":null}},"Refusal":{"BODY":"x","headers":{"c":"d"}}}`))
	f.Add([]byte(`{"refusal":{"status":1.5}}`))
	f.Add([]byte(`{"refusal":null,"refusal":{"headers":null}}`))
	f.Add([]byte(`{"charges":[{"rule_id":"a","cost_from":"b"},null,{"RULE_ID":"c"}],"charges":[{"cost_from":"d"}],"Charges":[]}`))
	f.Add([]byte(`{"charges":null,"charges":[{"x":[1]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var mine CheckResponse
		if err := DecodeCheckResponse(b, &mine); err != nil {
			return
		}
		var theirs CheckResponse
		if err := json.Unmarshal(b, &theirs); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		if !reflect.DeepEqual(mine, theirs) {
			t.Fatalf("%q:\n mine %+v\njson %+v", b, mine, theirs)
		}
	})
}

func BenchmarkDecodeCheckResponse(b *testing.B) {
	body, _ := json.Marshal(sampleDecision)
	b.Run("wire", func(b *testing.B) {
		for b.Loop() {
			var d CheckResponse
			if err := DecodeCheckResponse(body, &d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			var d CheckResponse
			if err := json.Unmarshal(body, &d); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzDecoderReuse: a Decoder that read other decisions before reads each
// one as a fresh decode does, whatever came before (its buffers and kept
// strings change nothing but allocations).
func FuzzDecoderReuse(f *testing.F) {
	sample, _ := json.Marshal(sampleDecision)
	f.Add(sample, []byte(`{"rule_id":"tier_free","strategy":"gcra","refusal":{"headers":{"a":"b"}}}`), []byte(`{"rule_id":"tier_fre"}`))
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		var dec Decoder
		for _, body := range [][]byte{a, b, c, a} {
			var mine, fresh CheckResponse
			errMine := dec.DecodeCheckResponse(body, &mine)
			errFresh := DecodeCheckResponse(body, &fresh)
			if (errMine == nil) != (errFresh == nil) || !reflect.DeepEqual(mine, fresh) {
				t.Fatalf("%q after others:\n reused %+v, %v\n fresh %+v, %v", body, mine, errMine, fresh, errFresh)
			}
		}
	})
}

func TestDecoderAllocations(t *testing.T) {
	body, _ := json.Marshal(CheckResponse{Allowed: true, Limit: 100, Remaining: 42, ResetAt: 1_800_000_060, Strategy: "token_bucket",
		WindowSeconds: 60, RuleID: "tier_free", Lease: Lease{Granted: 9, TTLMs: 1000}, Identity: "user:alice", Tier: "free"})
	var dec Decoder
	var d CheckResponse
	if err := dec.DecodeCheckResponse(body, &d); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { d = CheckResponse{}; _ = dec.DecodeCheckResponse(body, &d) }); n != 0 {
		t.Fatalf("a decision like the last one costs %v allocations, want none", n)
	}
}

// A cached denial's refusal is read back as encoding/json reads it, and
// what AppendRefusal writes of it reads back the same.
func FuzzDecodeRefusal(f *testing.F) {
	f.Add([]byte(`{"status":429,"body":"slow down {{.RetryAfter}}","headers":{"x-a":"b"}}`))
	f.Add([]byte(`{"STATUS":503,"headers":{"a":"1","a":null},"Headers":{"c":"d"}}`))
	f.Add([]byte(`{"status":1e2,"body":null}`))
	f.Add([]byte(` {"status":-0} `))
	f.Add([]byte(`{"headers":null,"body":"\ud83d\ude00\u0000"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var mine rules.Response
		if err := DecodeRefusal(b, &mine); err != nil {
			return
		}
		var theirs rules.Response
		if err := json.Unmarshal(b, &theirs); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		if !reflect.DeepEqual(mine, theirs) {
			t.Fatalf("%q:\n mine %+v\njson %+v", b, mine, theirs)
		}
		var again rules.Response
		if len(mine.Headers) == 0 {
			mine.Headers = nil // written as no headers at all
		}
		if err := DecodeRefusal(AppendRefusal(nil, &mine), &again); err != nil || !reflect.DeepEqual(again, mine) {
			t.Fatalf("%+v written and read back: %+v (%v)", mine, again, err)
		}
	})
}
