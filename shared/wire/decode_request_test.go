package wire

import (
	"encoding/json"
	"reflect"
	"testing"
)

var sampleCheck = []byte(`{"user_id":"user:alice","endpoint":"/api/v1/items","method":"GET","tier":"free","tenant":"acme","api_key":"ak_live_x","cost":1,"lease":10,"returned":2}`)

func TestDecodeCheckRequest(t *testing.T) {
	for _, body := range []string{
		string(sampleCheck),
		`{"user_id":"a","endpoint":"/x","limit":5,"window_seconds":60,"strategy":"gcra"}`,
		`{"user_id":"a","limit":null}`,
		`{"user_id":"user:a","client_address":"2001:db8::1","method_override":"DELETE"}`,
		`  {"user_id":"\u00e9\ud83d\ude00"} `,
		`{"user_id":"ip:192.0.2.1","lease":5,"lease_charges":true,"charge_returned":4400,"spent":600}`,
		`{"user_id":"u","returned":3,"leased_at":1795676400000000,"charge_returned":2,"charge_leased_at":1795676000000000}`,
	} {
		var mine, theirs CheckRequest
		if err := DecodeCheckRequest([]byte(body), &mine); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if err := json.Unmarshal([]byte(body), &theirs); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(mine, theirs) {
			t.Fatalf("%s:\n mine %+v\njson %+v", body, mine, theirs)
		}
	}
	// As strict as the admin API: a repeated key, another case or an
	// unknown field is refused (two readers could take different values).
	for _, body := range []string{`{"user_id":"a","user_id":"b"}`, `{"user_id":"a","limit":5,"limit":null}`, `{"USER_ID":"a"}`,
		`{"user_id":"user:a","client_address":"2001:db8::1","Client_Address":"192.0.2.1"}`, `{"user_id":"a","extra":{"deep":[1]}}`,
		`{"user_id":1}`, `{"cost":1.5}`, `{"limit":"5"}`, `{"user_id":"a"} {}`, `{"ſer_id":"a"}`, "{\"user_id\":\"\xff\"}", `[]`} {
		var r CheckRequest
		if DecodeCheckRequest([]byte(body), &r) == nil {
			t.Errorf("%s accepted", body)
		}
	}
}

// FuzzDecodeCheckRequest: what the fast decoder accepts, encoding/json
// accepts too, with the same result.
func FuzzDecodeCheckRequest(f *testing.F) {
	f.Add(sampleCheck)
	f.Add([]byte(`{"limit":null,"Limit":7,"window_seconds":-0,"x":[{}]}`))
	f.Add([]byte(`{"user_id":"user:a","client_address":"192.0.2.1"}`))
	f.Add([]byte(`{"user_id":"u","body_bytes":1024,"cost_headers":{"x-tokens":"250","x-b":"\u0041"}}`))
	f.Add([]byte(`{"cost_headers":{"a":"1","a":"2"}}`))
	f.Add([]byte(`{"cost_headers":null,"body_bytes":null}`))
	f.Add([]byte(`{"lease_charges":false,"charge_returned":7,"lease_charges":true}`))
	f.Add([]byte(`{"method_override":"DELETE","override_only":true,"override_only":false}`))
	f.Add([]byte(`{"user_id":"ip:192.0.2.1","endpoint":"/x","returned":9,"spent":1,"leased_at":5,"return_only":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var mine CheckRequest
		if DecodeCheckRequest(b, &mine) != nil {
			return
		}
		var theirs CheckRequest
		if err := json.Unmarshal(b, &theirs); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		if !reflect.DeepEqual(mine, theirs) {
			t.Fatalf("%q:\n mine %+v\njson %+v", b, mine, theirs)
		}
	})
}

func BenchmarkDecodeCheckRequest(b *testing.B) {
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r CheckRequest
			if err := DecodeCheckRequest(sampleCheck, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r CheckRequest
			if err := json.Unmarshal(sampleCheck, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
