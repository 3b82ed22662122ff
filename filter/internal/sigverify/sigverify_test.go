package sigverify

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"math/big"
	mrand "math/rand/v2"
	"testing"
)

// The standard library is the oracle: every answer here is crypto/rsa's or
// crypto/ecdsa's for the same key, digest and signature.

func ecKey(t testing.TB) (*ecdsa.PrivateKey, *P256Key) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub, ok := ParseP256(priv.X.FillBytes(make([]byte, 32)), priv.Y.FillBytes(make([]byte, 32)))
	if !ok {
		t.Fatal("a generated key was refused")
	}
	return priv, pub
}

func sig64(r, s *big.Int) []byte {
	out := make([]byte, 64)
	r.FillBytes(out[:32])
	s.FillBytes(out[32:])
	return out
}

func TestP256AgreesWithECDSA(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(1, 2))
	for range 40 {
		priv, pub := ecKey(t)
		digest := sha256.Sum256([]byte{byte(rng.Uint32())})
		r, s, err := ecdsa.Sign(rand.Reader, priv, digest[:])
		if err != nil {
			t.Fatal(err)
		}
		good := sig64(r, s)
		if !pub.Verify(digest, good) {
			t.Fatal("a valid signature was refused")
		}
		// Flipped bits anywhere, another digest, (r, -s): each as ecdsa says.
		for range 20 {
			bad := append([]byte(nil), good...)
			bad[rng.IntN(64)] ^= 1 << rng.IntN(8)
			want := ecdsa.Verify(&priv.PublicKey, digest[:], new(big.Int).SetBytes(bad[:32]), new(big.Int).SetBytes(bad[32:]))
			if pub.Verify(digest, bad) != want {
				t.Fatalf("a changed signature: got %v, ecdsa %v", !want, want)
			}
		}
		other := sha256.Sum256([]byte("other"))
		if pub.Verify(other, good) {
			t.Fatal("a signature verified for another digest")
		}
		negS := new(big.Int).Sub(priv.Curve.Params().N, s)
		if pub.Verify(digest, sig64(r, negS)) != ecdsa.Verify(&priv.PublicKey, digest[:], r, negS) {
			t.Fatal("(r, n - s) disagrees with ecdsa")
		}
	}
}

// Chosen digests (the test knows the private key d) reach the cases a
// random signature never does: u1·G + u2·Q at infinity (e = -r·d), and
// u1·G = u2·Q, where the sum is a doubling (e = r·d).
func TestP256EdgeCases(t *testing.T) {
	priv, pub := ecKey(t)
	n := priv.Curve.Params().N
	d := priv.D
	for name, eOf := range map[string]func(r *big.Int) *big.Int{
		"sum at infinity": func(r *big.Int) *big.Int { return new(big.Int).Mod(new(big.Int).Neg(new(big.Int).Mul(r, d)), n) },
		"a doubling":      func(r *big.Int) *big.Int { return new(big.Int).Mod(new(big.Int).Mul(r, d), n) },
	} {
		for range 5 {
			r, _ := rand.Int(rand.Reader, n)
			s, _ := rand.Int(rand.Reader, n)
			if r.Sign() == 0 || s.Sign() == 0 {
				continue
			}
			var digest [32]byte
			eOf(r).FillBytes(digest[:])
			want := ecdsa.Verify(&priv.PublicKey, digest[:], r, s)
			if got := pub.Verify(digest, sig64(r, s)); got != want {
				t.Fatalf("%s: got %v, ecdsa %v", name, got, want)
			}
		}
	}
	// A valid signature whose sum is a doubling: pick k, r = x(k·G),
	// s = 2rd/k, e = r·d; then u1 = u2·d = k/2 and u1·G + u2·Q = k·G.
	for range 5 {
		k, _ := rand.Int(rand.Reader, n)
		if k.Sign() == 0 {
			continue
		}
		rx, _ := elliptic.P256().ScalarBaseMult(k.FillBytes(make([]byte, 32)))
		r := new(big.Int).Mod(rx, n)
		sv := new(big.Int).Mul(big.NewInt(2), new(big.Int).Mul(r, d))
		sv.Mul(sv, new(big.Int).ModInverse(k, n)).Mod(sv, n)
		var digest [32]byte
		new(big.Int).Mod(new(big.Int).Mul(r, d), n).FillBytes(digest[:])
		if !ecdsa.Verify(&priv.PublicKey, digest[:], r, sv) {
			t.Fatal("the constructed signature is not valid for ecdsa either")
		}
		if !pub.Verify(digest, sig64(r, sv)) {
			t.Fatal("a valid signature whose sum is a doubling was refused")
		}
	}
	// A valid signature whose digest is at least n (e is reduced modulo n).
	for range 20 {
		digest := sha256.Sum256([]byte{1})
		big.NewInt(0).Add(n, big.NewInt(int64(mrand.IntN(1000)))).FillBytes(digest[:])
		r, s, err := ecdsa.Sign(rand.Reader, priv, digest[:])
		if err != nil {
			t.Fatal(err)
		}
		if !pub.Verify(digest, sig64(r, s)) {
			t.Fatal("a valid signature of a digest above n was refused")
		}
	}
	// r and s out of range, and the wrong length.
	digest := sha256.Sum256([]byte("x"))
	r, s, _ := ecdsa.Sign(rand.Reader, priv, digest[:])
	for name, sig := range map[string][]byte{
		"r = 0":      sig64(big.NewInt(0), s),
		"s = 0":      sig64(r, big.NewInt(0)),
		"r = n":      sig64(n, s),
		"s = n":      sig64(r, n),
		"r + n":      sig64(new(big.Int).Mod(new(big.Int).Add(r, n), new(big.Int).Lsh(big.NewInt(1), 256)), s),
		"all ones":   append(make([]byte, 0, 64), sig64(new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1)), s)...),
		"63 bytes":   sig64(r, s)[:63],
		"65 bytes":   append(sig64(r, s), 0),
		"no bytes":   nil,
		"swapped":    sig64(s, r),
		"r only (s)": sig64(r, r),
	} {
		if pub.Verify(digest, sig) {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestParseP256(t *testing.T) {
	priv, _ := ecKey(t)
	x, y := priv.X.FillBytes(make([]byte, 32)), priv.Y.FillBytes(make([]byte, 32))
	p := elliptic.P256().Params().P
	yBad := new(big.Int).Add(priv.Y, big.NewInt(1)).FillBytes(make([]byte, 32))
	xPlusP := new(big.Int).Add(priv.X, p)
	for name, xy := range map[string][2][]byte{
		"off the curve":   {x, yBad},
		"zero":            {make([]byte, 32), make([]byte, 32)},
		"short":           {x[:31], y},
		"x at least p":    {p.FillBytes(make([]byte, 32)), y},
		"x + p (too big)": {xPlusP.Bytes()[len(xPlusP.Bytes())-32:], y},
	} {
		if _, ok := ParseP256(xy[0], xy[1]); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, ok := ParseP256(x, y); !ok {
		t.Fatal("a real key was refused")
	}
}

func TestRSAAgreesWithRSA(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(3, 4))
	for _, bitsize := range []int{2048, 3072} {
		priv, err := rsa.GenerateKey(rand.Reader, bitsize)
		if err != nil {
			t.Fatal(err)
		}
		pub, ok := ParseRSA(priv.N.Bytes(), big.NewInt(int64(priv.E)).Bytes())
		if !ok {
			t.Fatal("a generated key was refused")
		}
		for range 10 {
			digest := sha256.Sum256([]byte{byte(rng.Uint32())})
			good, err := rsa.SignPKCS1v15(rand.Reader, priv, crypto.SHA256, digest[:])
			if err != nil {
				t.Fatal(err)
			}
			if !pub.VerifyPKCS1v15(digest, good) {
				t.Fatal("a valid signature was refused")
			}
			for range 10 {
				bad := append([]byte(nil), good...)
				bad[rng.IntN(len(bad))] ^= 1 << rng.IntN(8)
				want := rsa.VerifyPKCS1v15(&priv.PublicKey, crypto.SHA256, digest[:], bad) == nil
				if pub.VerifyPKCS1v15(digest, bad) != want {
					t.Fatalf("a changed signature: got %v, rsa %v", !want, want)
				}
			}
			other := sha256.Sum256([]byte("other"))
			if pub.VerifyPKCS1v15(other, good) {
				t.Fatal("verified for another digest")
			}
			// The signature plus the modulus (s >= n), shorter, longer.
			over := new(big.Int).Add(new(big.Int).SetBytes(good), priv.N).Bytes()
			for name, sig := range map[string][]byte{"s + n": over, "short": good[1:], "long": append([]byte{0}, good...), "zero": make([]byte, len(good))} {
				if pub.VerifyPKCS1v15(digest, sig) {
					t.Fatalf("%s: accepted", name)
				}
			}
		}
		// A signature made with SHA-1's DigestInfo, or of a raw digest, is
		// not an RS256 signature.
		digest := sha256.Sum256([]byte("x"))
		sha1Style, _ := rsa.SignPKCS1v15(rand.Reader, priv, crypto.Hash(0), digest[:])
		if pub.VerifyPKCS1v15(digest, sha1Style) {
			t.Fatal("a signature without DigestInfo was accepted")
		}
	}
}

func TestParseRSA(t *testing.T) {
	n := make([]byte, 256)
	n[0], n[255] = 0xc0, 1
	even := append([]byte(nil), n...)
	even[255] = 2
	for name, ne := range map[string][2][]byte{
		"1024 bits":           {n[128:], {1, 0, 1}},
		"even modulus":        {even, {1, 0, 1}},
		"exponent 1":          {n, {1}},
		"even exponent":       {n, {2}},
		"exponent 2^31 + 1":   {n, {0x80, 0, 0, 1}},
		"exponent of 5 bytes": {n, {1, 0, 0, 0, 1}},
		"no exponent":         {n, nil},
		"9000-bit modulus":    {append([]byte{1}, make([]byte, 1125)...), {1, 0, 1}},
	} {
		if _, ok := ParseRSA(ne[0], ne[1]); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, ok := ParseRSA(append([]byte{0, 0}, n...), []byte{0, 1, 0, 1}); !ok {
		t.Fatal("leading zeros refused")
	}
}

// FuzzP256: any signature bytes and digest, the same answer as ecdsa's.
func FuzzP256(f *testing.F) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	pub, _ := ParseP256(priv.X.FillBytes(make([]byte, 32)), priv.Y.FillBytes(make([]byte, 32)))
	digest := sha256.Sum256([]byte("seed"))
	r, s, _ := ecdsa.Sign(rand.Reader, priv, digest[:])
	f.Add(digest[:], sig64(r, s))
	f.Add(make([]byte, 32), make([]byte, 64))
	f.Fuzz(func(t *testing.T, d, sig []byte) {
		if len(d) != 32 {
			return
		}
		var digest [32]byte
		copy(digest[:], d)
		want := len(sig) == 64 && ecdsa.Verify(&priv.PublicKey, d, new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:]))
		if pub.Verify(digest, sig) != want {
			t.Fatalf("got %v, ecdsa %v", !want, want)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	priv, pub := ecKey(b)
	digest := sha256.Sum256([]byte("x"))
	r, s, _ := ecdsa.Sign(rand.Reader, priv, digest[:])
	sig := sig64(r, s)
	b.Run("ES256", func(b *testing.B) {
		for b.Loop() {
			if !pub.Verify(digest, sig) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("ES256/crypto-ecdsa", func(b *testing.B) {
		for b.Loop() {
			if !ecdsa.Verify(&priv.PublicKey, digest[:], r, s) {
				b.Fatal("refused")
			}
		}
	})
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	rpub, _ := ParseRSA(rk.N.Bytes(), big.NewInt(int64(rk.E)).Bytes())
	rsig, _ := rsa.SignPKCS1v15(rand.Reader, rk, crypto.SHA256, digest[:])
	b.Run("RS256", func(b *testing.B) {
		for b.Loop() {
			if !rpub.VerifyPKCS1v15(digest, rsig) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("RS256/crypto-rsa", func(b *testing.B) {
		for b.Loop() {
			if rsa.VerifyPKCS1v15(&rk.PublicKey, crypto.SHA256, digest[:], rsig) != nil {
				b.Fatal("refused")
			}
		}
	})
}

// p256Mul is modulus.mul for P-256's prime, for any values below p.
func FuzzP256Mul(f *testing.F) {
	f.Add([]byte{1}, []byte{2})
	pm1 := new(big.Int).Sub(elliptic.P256().Params().P, big.NewInt(1)).Bytes()
	f.Add(pm1, pm1)
	f.Fuzz(func(t *testing.T, a, b []byte) {
		p := elliptic.P256().Params().P
		x := new(big.Int).Mod(new(big.Int).SetBytes(a), p).FillBytes(make([]byte, 32))
		y := new(big.Int).Mod(new(big.Int).SetBytes(b), p).FillBytes(make([]byte, 32))
		var xa, ya, got [4]uint64
		copy(xa[:], limbs(x))
		copy(ya[:], limbs(y))
		want := make([]uint64, 4)
		p256P.mul(want, xa[:], ya[:])
		p256Mul(&got, &xa, &ya)
		if !equal(got[:], want) {
			t.Fatalf("%x · %x: got %x, want %x", x, y, got, want)
		}
	})
}

// p256Add and p256Sub are modulus.addMod and subMod for P-256's prime.
func FuzzP256AddSub(f *testing.F) {
	pm1 := new(big.Int).Sub(elliptic.P256().Params().P, big.NewInt(1)).Bytes()
	f.Add(pm1, pm1)
	f.Add([]byte{0}, pm1)
	f.Fuzz(func(t *testing.T, a, b []byte) {
		p := elliptic.P256().Params().P
		var xa, ya, got [4]uint64
		copy(xa[:], limbs(new(big.Int).Mod(new(big.Int).SetBytes(a), p).FillBytes(make([]byte, 32))))
		copy(ya[:], limbs(new(big.Int).Mod(new(big.Int).SetBytes(b), p).FillBytes(make([]byte, 32))))
		want := make([]uint64, 4)
		p256P.addMod(want, xa[:], ya[:])
		if p256Add(&got, &xa, &ya); !equal(got[:], want) {
			t.Fatalf("add: got %x, want %x", got, want)
		}
		p256P.subMod(want, xa[:], ya[:])
		if p256Sub(&got, &xa, &ya); !equal(got[:], want) {
			t.Fatalf("sub: got %x, want %x", got, want)
		}
	})
}
