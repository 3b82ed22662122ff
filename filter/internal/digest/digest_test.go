package digest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// FIPS 180-4 examples (NIST's SHA256.pdf) and RFC 4231 test case 2.
func TestVectors(t *testing.T) {
	for msg, want := range map[string]string{
		"":    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		"abc": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
		"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq": "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
		strings.Repeat("a", 1_000_000):                             "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
	} {
		if got := Sum256([]byte(msg)); hex.EncodeToString(got[:]) != want {
			t.Errorf("SHA-256 of %d bytes: %x", len(msg), got)
		}
	}
	if got := HMAC([]byte("Jefe"), []byte("what do ya want for nothing?")); hex.EncodeToString(got[:]) != "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843" {
		t.Errorf("HMAC: %x", got)
	}
}

// Whatever the message and key, and however the message is written, the
// standard library's answers.
func FuzzAgreesWithCrypto(f *testing.F) {
	f.Add([]byte("key"), []byte("message"), 3)
	f.Add([]byte(strings.Repeat("k", 65)), []byte(strings.Repeat("m", 200)), 64)
	f.Fuzz(func(t *testing.T, key, msg []byte, split int) {
		d := New()
		if split >= 0 && split <= len(msg) {
			d.Write(msg[:split])
			d.Write(msg[split:])
		} else {
			d.Write(msg)
		}
		if got, want := d.Sum(), sha256.Sum256(msg); got != want {
			t.Fatalf("SHA-256: %x, want %x", got, want)
		}
		m := hmac.New(sha256.New, key)
		m.Write(msg)
		if got := HMAC(key, msg); !hmac.Equal(got[:], m.Sum(nil)) {
			t.Fatalf("HMAC: %x", got)
		}
		other := append([]byte(nil), msg...)
		if Equal(msg, other) != true || len(msg) > 0 && Equal(msg, append(other[:len(other)-1:len(other)-1], other[len(other)-1]^1)) {
			t.Fatal("Equal")
		}
	})
}
