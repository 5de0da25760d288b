package kvevents

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzDecode checks that Decode never panics, and that whatever it accepts re-encodes stably: encoding the
// decoded batch (map layout, int hashes) and decoding that again gives the same bytes on a second encode.
// The seed corpus (testdata/fuzz/FuzzDecode) holds the golden payloads and hand-made malformed ones.
// The Ingester's decodeInto, with one arena reused across inputs as the Ingester reuses it, must give the
// same result or error as Decode.
func FuzzDecode(f *testing.F) {
	for _, p := range loadPayloads(f) {
		f.Add(p)
	}
	var a arena // reused across inputs (the fuzz function runs sequentially in each worker)
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		ba, erra := decodeInto(payload, &a)
		if (err == nil) != (erra == nil) || (err != nil && err.Error() != erra.Error()) {
			t.Fatalf("Decode error %v, decodeInto error %v", err, erra)
		}
		if !reflect.DeepEqual(b, ba) {
			t.Fatalf("decodeInto differs from Decode:\n%#v\n%#v", ba, b)
		}
		if err != nil {
			if _, ok := err.(*DecodeError); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		strip(&b)
		p1, err := Encode(b, LayoutMap, HashUint)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		b2, err := Decode(p1)
		if err != nil {
			t.Fatalf("decode of re-encoded %x: %v", p1, err)
		}
		strip(&b2)
		p2, err := Encode(b2, LayoutMap, HashUint)
		if err != nil {
			t.Fatalf("second re-encode: %v", err)
		}
		if !bytes.Equal(p1, p2) {
			t.Fatalf("unstable round trip:\n%x\n%x", p1, p2)
		}
	})
}

// strip drops what the map/int re-encoding cannot carry: raw digests and SGLang's cache salt.
func strip(b *EventBatch) {
	for i, ev := range b.Events {
		switch e := ev.(type) {
		case BlockStored:
			e.RawBlockHashes, e.RawParentBlockHash, e.CacheSalt = nil, nil, ""
			if e.ExtraKeys != nil && len(e.ExtraKeys) != len(e.BlockHashes) {
				e.ExtraKeys = nil
			}
			b.Events[i] = e
		case BlockRemoved:
			e.RawBlockHashes = nil
			b.Events[i] = e
		}
	}
}
