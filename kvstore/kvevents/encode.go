package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// ErrEncode is wrapped by every error Encode returns (bad layout or hash form, an event type the layout
// cannot carry, a missing or inconsistent raw digest for HashBytes).
var ErrEncode = errors.New("kvevents: cannot encode")

type encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

var encPool = sync.Pool{New: func() any {
	e := &encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	e.enc.UseCompactInts(true)
	return e
}}

// Encode serializes b in layout with hashes in form, byte for byte as vLLM's / SGLang's publishers (msgspec,
// or msgpack-python with use_bin_type=True) would for the same values: ints in their narrowest encoding,
// floats as float64, strings as str, digests as bin, empty strings and nil pointers as nil. Fields a layout
// does not have are not written (LayoutV090 drops Medium and the batch rank; array layouts before
// LayoutArrayLast drop ExtraKeys and GroupIdx). Errors wrap ErrEncode. Safe for concurrent use.
func Encode(b EventBatch, layout Layout, form HashForm) ([]byte, error) {
	if _, ok := layoutNames[layout]; !ok {
		return nil, fmt.Errorf("%w: unknown layout %d", ErrEncode, int(layout))
	}
	if form != HashUint && form != HashInt64 && form != HashBytes {
		return nil, fmt.Errorf("%w: unknown hash form %d", ErrEncode, int(form))
	}
	e := encPool.Get().(*encoder)
	defer encPool.Put(e)
	e.buf.Reset()
	if err := e.batch(b, layout, form); err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

func (e *encoder) batch(b EventBatch, layout Layout, form HashForm) error {
	enc := e.enc
	switch layout {
	case LayoutMapBatch:
		n := 2
		if b.DataParallelRank != nil {
			n = 3
		}
		_ = enc.EncodeMapLen(n)
		_ = enc.EncodeString("ts")
		_ = enc.EncodeFloat64(b.TS)
		_ = enc.EncodeString("events")
		if err := e.events(b.Events, layout, form); err != nil {
			return err
		}
		if b.DataParallelRank != nil {
			_ = enc.EncodeString("data_parallel_rank")
			_ = enc.EncodeInt(int64(*b.DataParallelRank))
		}
		return nil
	case LayoutV090:
		_ = enc.EncodeArrayLen(2)
		_ = enc.EncodeFloat64(b.TS)
		return e.events(b.Events, layout, form)
	default:
		_ = enc.EncodeArrayLen(3)
		_ = enc.EncodeFloat64(b.TS)
		if err := e.events(b.Events, layout, form); err != nil {
			return err
		}
		e.intPtr(b.DataParallelRank)
		return nil
	}
}

func (e *encoder) events(evs []Event, layout Layout, form HashForm) error {
	_ = e.enc.EncodeArrayLen(len(evs))
	for i, ev := range evs {
		var err error
		switch v := ev.(type) {
		case BlockStored:
			err = e.stored(&v, layout, form)
		case *BlockStored:
			err = e.stored(v, layout, form)
		case BlockRemoved:
			err = e.removed(&v, layout, form)
		case *BlockRemoved:
			err = e.removed(v, layout, form)
		case AllBlocksCleared, *AllBlocksCleared:
			if layout == LayoutMap || layout == LayoutMapBatch {
				_ = e.enc.EncodeMapLen(1)
				_ = e.enc.EncodeString("type")
			} else {
				_ = e.enc.EncodeArrayLen(1)
			}
			_ = e.enc.EncodeString(TagAllBlocksCleared)
		default:
			err = fmt.Errorf("%w: event type %T", ErrEncode, ev)
		}
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

// storedFields is the number of BlockStored elements (tag included) per array layout.
func storedFields(layout Layout) int {
	switch layout {
	case LayoutV090:
		return 6
	case LayoutV011, LayoutSGLang:
		return 7
	case LayoutLoRAName:
		return 8
	default: // LayoutArrayLast
		return 12
	}
}

func (e *encoder) stored(s *BlockStored, layout Layout, form HashForm) error {
	enc := e.enc
	isMap := layout == LayoutMap || layout == LayoutMapBatch
	if !isMap && layout != LayoutArrayLast && (s.ExtraKeys != nil || s.GroupIdx != nil ||
		s.KVCacheSpecKind != "" || s.KVCacheSpecSlidingWindow != nil) {
		return fmt.Errorf("%w: layout %s has no extra_keys/group_idx/kv_cache_spec fields", ErrEncode, layout)
	}
	if layout == LayoutV090 && (s.Medium != "" || s.LoRAName != "") {
		return fmt.Errorf("%w: layout %s has no medium/lora_name fields", ErrEncode, layout)
	}
	if (layout == LayoutV011 || layout == LayoutSGLang) && s.LoRAName != "" {
		return fmt.Errorf("%w: layout %s has no lora_name field", ErrEncode, layout)
	}
	if s.ExtraKeys != nil && len(s.ExtraKeys) != len(s.BlockHashes) {
		return fmt.Errorf("%w: %d extra_keys entries for %d blocks", ErrEncode, len(s.ExtraKeys), len(s.BlockHashes))
	}
	key := func(k string) {
		if isMap {
			_ = enc.EncodeString(k)
		}
	}
	if isMap {
		n := 8
		if s.ExtraKeys != nil {
			n++
		}
		if s.GroupIdx != nil {
			n++
		}
		if s.KVCacheSpecKind != "" {
			n++
		}
		if s.KVCacheSpecSlidingWindow != nil {
			n++
		}
		_ = enc.EncodeMapLen(n)
		_ = enc.EncodeString("type")
	} else {
		_ = enc.EncodeArrayLen(storedFields(layout))
	}
	_ = enc.EncodeString(TagBlockStored)
	key("block_hashes")
	if err := e.hashes(s.BlockHashes, s.RawBlockHashes, form); err != nil {
		return err
	}
	key("parent_block_hash")
	if s.ParentBlockHash == nil {
		_ = enc.EncodeNil()
	} else if err := e.hash(*s.ParentBlockHash, s.RawParentBlockHash, form); err != nil {
		return err
	}
	key("token_ids")
	_ = enc.EncodeArrayLen(len(s.TokenIDs))
	for _, t := range s.TokenIDs {
		_ = enc.EncodeUint(uint64(t))
	}
	key("block_size")
	_ = enc.EncodeInt(int64(s.BlockSize))
	key("lora_id")
	e.intPtr(s.LoRAID)
	if layout == LayoutV090 {
		return nil
	}
	key("medium")
	e.str(s.Medium)
	if layout == LayoutV011 || layout == LayoutSGLang {
		return nil
	}
	key("lora_name")
	e.str(s.LoRAName)
	if layout == LayoutLoRAName {
		return nil
	}
	if !isMap || s.ExtraKeys != nil {
		key("extra_keys")
		if err := e.extraKeys(s.ExtraKeys); err != nil {
			return err
		}
	}
	if !isMap || s.GroupIdx != nil {
		key("group_idx")
		e.intPtr(s.GroupIdx)
	}
	if !isMap || s.KVCacheSpecKind != "" {
		key("kv_cache_spec_kind")
		e.str(s.KVCacheSpecKind)
	}
	if !isMap || s.KVCacheSpecSlidingWindow != nil {
		key("kv_cache_spec_sliding_window")
		e.intPtr(s.KVCacheSpecSlidingWindow)
	}
	return nil
}

func (e *encoder) removed(r *BlockRemoved, layout Layout, form HashForm) error {
	enc := e.enc
	isMap := layout == LayoutMap || layout == LayoutMapBatch
	if layout == LayoutV090 && r.Medium != "" {
		return fmt.Errorf("%w: layout %s has no medium field", ErrEncode, layout)
	}
	if !isMap && layout != LayoutArrayLast && r.GroupIdx != nil {
		return fmt.Errorf("%w: layout %s has no group_idx field", ErrEncode, layout)
	}
	switch {
	case isMap:
		n := 3
		if r.GroupIdx != nil {
			n++
		}
		_ = enc.EncodeMapLen(n)
		_ = enc.EncodeString("type")
	case layout == LayoutV090:
		_ = enc.EncodeArrayLen(2)
	case layout == LayoutArrayLast:
		_ = enc.EncodeArrayLen(4)
	default:
		_ = enc.EncodeArrayLen(3)
	}
	_ = enc.EncodeString(TagBlockRemoved)
	if isMap {
		_ = enc.EncodeString("block_hashes")
	}
	if err := e.hashes(r.BlockHashes, r.RawBlockHashes, form); err != nil {
		return err
	}
	if layout == LayoutV090 {
		return nil
	}
	if isMap {
		_ = enc.EncodeString("medium")
	}
	e.str(r.Medium)
	if isMap && r.GroupIdx != nil {
		_ = enc.EncodeString("group_idx")
		e.intPtr(r.GroupIdx)
	} else if layout == LayoutArrayLast {
		e.intPtr(r.GroupIdx)
	}
	return nil
}

func (e *encoder) hashes(hs []EngineHash, raw [][]byte, form HashForm) error {
	if form == HashBytes && len(raw) != len(hs) {
		return fmt.Errorf("%w: hash form bytes needs %d raw digests, have %d", ErrEncode, len(hs), len(raw))
	}
	_ = e.enc.EncodeArrayLen(len(hs))
	for i, h := range hs {
		var r []byte
		if form == HashBytes {
			r = raw[i]
		}
		if err := e.hash(h, r, form); err != nil {
			return err
		}
	}
	return nil
}

func (e *encoder) hash(h EngineHash, raw []byte, form HashForm) error {
	switch form {
	case HashUint:
		_ = e.enc.EncodeUint(uint64(h))
	case HashInt64:
		_ = e.enc.EncodeInt(int64(h))
	case HashBytes:
		if raw == nil {
			return fmt.Errorf("%w: hash form bytes needs the raw digest of %d", ErrEncode, uint64(h))
		}
		if HashFromDigest(raw) != h {
			return fmt.Errorf("%w: raw digest %x does not reduce to %d", ErrEncode, raw, uint64(h))
		}
		_ = e.enc.EncodeBytes(raw)
	}
	return nil
}

func (e *encoder) intPtr(p *int) {
	if p == nil {
		_ = e.enc.EncodeNil()
		return
	}
	_ = e.enc.EncodeInt(int64(*p))
}

func (e *encoder) str(s string) {
	if s == "" {
		_ = e.enc.EncodeNil()
		return
	}
	_ = e.enc.EncodeString(s)
}

func (e *encoder) extraKeys(ks []ExtraKey) error {
	if ks == nil {
		_ = e.enc.EncodeNil()
		return nil
	}
	_ = e.enc.EncodeArrayLen(len(ks))
	for _, k := range ks {
		if k == nil {
			_ = e.enc.EncodeNil()
			continue
		}
		if err := e.value([]any(k), 0); err != nil {
			return err
		}
	}
	return nil
}

// value writes one extra-key element; the accepted types are those Decode produces for extra keys.
func (e *encoder) value(v any, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: extra key nested deeper than %d", ErrEncode, maxDepth)
	}
	switch x := v.(type) {
	case nil:
		_ = e.enc.EncodeNil()
	case string:
		_ = e.enc.EncodeString(x)
	case []byte:
		_ = e.enc.EncodeBytes(x)
	case bool:
		_ = e.enc.EncodeBool(x)
	case int:
		_ = e.enc.EncodeInt(int64(x))
	case int64:
		_ = e.enc.EncodeInt(x)
	case uint64:
		_ = e.enc.EncodeUint(x)
	case float64:
		_ = e.enc.EncodeFloat64(x)
	case []any:
		_ = e.enc.EncodeArrayLen(len(x))
		for _, el := range x {
			if err := e.value(el, depth+1); err != nil {
				return err
			}
		}
	case ExtraKey:
		return e.value([]any(x), depth)
	default:
		return fmt.Errorf("%w: extra key element of type %T", ErrEncode, v)
	}
	return nil
}
