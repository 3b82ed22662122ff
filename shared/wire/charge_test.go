package wire

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzAppendChargeRequest: the filter's charge encoder writes exactly what
// json.Marshal writes.
func FuzzAppendChargeRequest(f *testing.F) {
	f.Add("user:a<b>&\"c\"", "/v1/chat/completions", "POST", "free", "ak_live_x", "llm", int64(1234), "", 2)
	f.Add("", "", "", "", "", "\xff\x00\u2028", int64(-1), UnreportedCut, 0)
	f.Add("ip:192.0.2.1", "/", "", "", "", "", int64(0), UnreportedMissing, -1)
	f.Fuzz(func(t *testing.T, user, endpoint, method, tier, key, rule string, cost int64, unreported string, n int) {
		r := ChargeRequest{UserID: user, Endpoint: endpoint, Method: method, Tier: tier, Tenant: tier + method, APIKey: key,
			ClientAddress: method, MethodOverride: tier}
		if n >= 0 {
			r.Charges = []ChargeItem{}
		}
		for i := 0; i < n%5; i++ {
			c := ChargeItem{RuleID: rule, Unreported: unreported}
			if i%2 == 0 {
				v := cost + int64(i)
				c.Cost = &v
			} else {
				c.Reserved, c.ReservedAt, c.AtLeast = cost, cost*int64(i), cost-int64(i)
			}
			r.Charges = append(r.Charges, c)
		}
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendChargeRequest(nil, &r); string(got) != string(want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
	})
}

func TestDecodeChargeResponse(t *testing.T) {
	in := ChargeResponse{Results: []ChargeResult{{RuleID: "llm", Charged: 1233, Clamped: 7, Limit: 10000, Remaining: 0, ResetAt: 1_800_000_060,
		Strategy: "token_bucket", WindowSeconds: 60},
		{RuleID: "gone", Error: "rule gone no longer applies"}}}
	b, _ := json.Marshal(in)
	var got ChargeResponse
	if err := DecodeChargeResponse(b, &got); err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("%s: %+v %v", b, got, err)
	}
	for _, bad := range []string{``, `[]`, `{"results":{}}`, `{"results":[{"charged":1.5}]}`, `{"results":[1]}`, `{"results":[`, `{"results":[{}]} x`} {
		var r ChargeResponse
		if err := DecodeChargeResponse([]byte(bad), &r); err == nil {
			t.Errorf("%q accepted: %+v", bad, r)
		}
	}
}

// FuzzDecodeChargeResponse holds the decoder to encoding/json: whatever it
// accepts, encoding/json accepts too, with the same result.
func FuzzDecodeChargeResponse(f *testing.F) {
	f.Add([]byte(`{"results":[{"rule_id":"llm","charged":99,"limit":100,"remaining":0,"reset_at":5}]}`))
	f.Add([]byte(`{"results":[null,{"RULE_ID":"a","error":"x"}],"results":[{"clamped":3}],"other":[1,{"a":null}]}`))
	f.Add([]byte(`{"results":null}`))
	f.Add([]byte(`{"results":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var mine ChargeResponse
		if err := DecodeChargeResponse(b, &mine); err != nil {
			return
		}
		var theirs ChargeResponse
		if err := json.Unmarshal(b, &theirs); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		if !reflect.DeepEqual(mine, theirs) {
			t.Fatalf("%q:\n mine %+v\njson %+v", b, mine, theirs)
		}
	})
}
