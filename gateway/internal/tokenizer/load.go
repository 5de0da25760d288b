package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Load reads an HF model directory: tokenizer.json (or tokenizer.json.gz) and, when present,
// tokenizer_config.json (for the BOS/EOS token names). It fails with *UnsupportedError for any component
// the encoder or decoder would not reproduce exactly, and with ErrNoTokenizerFile when there is no
// tokenizer file.
func Load(dir string) (*Tokenizer, error) {
	data, err := readTokenizerFile(dir)
	if err != nil {
		return nil, err
	}
	var cfg []byte
	if b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		cfg = b
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return New(data, cfg)
}

func readTokenizerFile(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	f, err := os.Open(filepath.Join(dir, "tokenizer.json.gz"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNoTokenizerFile, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", f.Name(), err)
	}
	var buf bytes.Buffer
	if st, err := f.Stat(); err == nil {
		buf.Grow(int(st.Size()) * 5)
	}
	if _, err := io.Copy(&buf, zr); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", f.Name(), err)
	}
	return buf.Bytes(), nil
}

// fileJSON is the part of tokenizer.json this package reads; the big vocab and merges members are kept raw
// and read by parseVocab/parseMerges.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         modelJSON        `json:"model"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"` // absent means true, HF's AddedToken default
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

// maxVocabID bounds vocab IDs (the largest real vocabularies hold about 2^18 tokens).
const maxVocabID = 1 << 24

// typed reads the "type" member of a component.
type typed struct {
	Type string `json:"type"`
}

// New builds a Tokenizer from the bytes of tokenizer.json and (optionally, may be nil) tokenizer_config.json.
func New(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	f, err := decodeFile(tokenizerJSON)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{}
	if t.pre, t.byteLevel, t.scanner, err = buildPreTokenizer(f.PreTokenizer, "pre_tokenizer"); err != nil {
		return nil, err
	}
	if err := t.buildModel(&f.Model); err != nil {
		return nil, err
	}
	if t.norm, err = buildNormalizer(f.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	if err := t.buildAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	if t.prefix, t.suffix, err = buildPostProcessor(f.PostProcessor, "post_processor", t); err != nil {
		return nil, err
	}
	if t.dec, err = buildDecoder(f.Decoder, "decoder"); err != nil {
		return nil, err
	}
	if t.dec.byteLevel != t.byteLevel && f.Decoder != nil && string(f.Decoder) != "null" {
		// A ByteLevel decoder over a non-byte-level vocab (or the reverse) is not a combination any model
		// ships; refuse it rather than guess.
		return nil, unsupported("decoder", "ByteLevel", "decoder and pre-tokenizer disagree on byte-level")
	}
	if len(configJSON) > 0 {
		if err := t.readConfig(configJSON); err != nil {
			return nil, err
		}
	}
	t.textCuts = t.textCutsSafe()
	t.cache = newWordCache(wordCacheSlots)
	return t, nil
}

// decodeFile reads tokenizer.json. The model's vocab and merges (nearly all of the file) are cut out by a
// fast skipper and left raw for parseVocab/parseMerges; everything else goes through encoding/json.
func decodeFile(data []byte) (*fileJSON, error) {
	top, model, err := fileMembers(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	if model == nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json has no model object")
	}
	var small bytes.Buffer
	small.WriteByte('{')
	for k, v := range top {
		if k == "model" {
			continue
		}
		if small.Len() > 1 {
			small.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		small.Write(kb)
		small.WriteByte(':')
		small.Write(v)
	}
	small.WriteString(`,"model":{`)
	n := 0
	for k, v := range model {
		if k == "vocab" || k == "merges" {
			continue
		}
		if n > 0 {
			small.WriteByte(',')
		}
		n++
		kb, _ := json.Marshal(k)
		small.Write(kb)
		small.WriteByte(':')
		small.Write(v)
	}
	small.WriteString("}}")
	var f fileJSON
	if err := json.Unmarshal(small.Bytes(), &f); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	f.Model.Vocab = model["vocab"]
	f.Model.Merges = model["merges"]
	if f.Model.Vocab == nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json model has no vocab")
	}
	if f.Model.Merges == nil {
		f.Model.Merges = []byte("[]")
	}
	return &f, nil
}

func (t *Tokenizer) buildModel(m *modelJSON) error {
	if m.Type != "BPE" && m.Type != "" {
		return unsupported("model", m.Type, "only BPE models are implemented")
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return unsupported("model", "BPE", "dropout")
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return unsupported("model", "BPE", "continuing_subword_prefix")
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return unsupported("model", "BPE", "end_of_word_suffix")
	}
	b := &bpe{fuseUnk: m.FuseUnk, byteFallback: m.ByteFallback, ignoreMerges: m.IgnoreMerges, unk: -1}
	byteLevel := t.byteLevel
	var vb strTableBuilder
	vb.arena = make([]byte, 0, len(m.Vocab)/2)
	vb.ents = make([]strEnt, 0, 1<<17)
	var kb []byte
	err := parseVocab(m.Vocab, func(raw []byte, id uint32) {
		if byteLevel {
			var ok bool
			if kb, ok = appendByteLevelDecode(kb[:0], raw); ok {
				raw = kb
			}
		}
		vb.add(raw, id)
	})
	if err != nil {
		return fmt.Errorf("tokenizer: model.vocab: %w", err)
	}
	// IDs index dense tables: refuse a sparse vocab that would make them huge.
	if len(vb.ents) > 0 && vb.maxID >= maxVocabID {
		return fmt.Errorf("tokenizer: model.vocab: ID %d is too large (limit %d)", vb.maxID, maxVocabID-1)
	}
	b.vocab = vb.build()
	if byteLevel {
		for i := range b.byteID {
			id, ok := b.vocab.get(string([]byte{byte(i)}))
			if !ok {
				b.byteID[i] = -1
				continue
			}
			b.byteID[i] = int32(id)
		}
	}
	if b.byteFallback {
		for i := range b.fallbackID {
			id, ok := b.vocab.get(fmt.Sprintf("<0x%02X>", i))
			if !ok {
				b.fallbackID[i] = -1
				continue
			}
			b.fallbackID[i] = int32(id)
		}
	}
	if m.UnkToken != nil {
		id, ok := b.vocab.get(*m.UnkToken)
		if !ok {
			return fmt.Errorf("tokenizer: model.unk_token %q is not in the vocab", *m.UnkToken)
		}
		b.unk = int32(id)
	}
	b.merges = newMergeTable(1 << 18)
	rank := uint32(0)
	var buf []byte
	err = parseMerges(m.Merges, func(x, y []byte) error {
		buf = buf[:0]
		nx := len(x)
		if byteLevel {
			var okx, oky bool
			buf, okx = appendByteLevelDecode(buf, x)
			nx = len(buf)
			buf, oky = appendByteLevelDecode(buf, y)
			if !okx || !oky {
				return fmt.Errorf("tokenizer: merge %q %q is not in the byte-level alphabet", x, y)
			}
		} else {
			buf = append(append(buf, x...), y...)
		}
		a, ok1 := b.vocab.getBytes(buf[:nx])
		c, ok2 := b.vocab.getBytes(buf[nx:])
		n, ok3 := b.vocab.getBytes(buf)
		if !ok1 || !ok2 || !ok3 {
			return fmt.Errorf("tokenizer: merge %q %q uses a token outside the vocab", x, y)
		}
		b.merges.put(a, c, rank, n)
		rank++
		return nil
	})
	if err != nil {
		return fmt.Errorf("tokenizer: model.merges: %w", err)
	}
	t.model = b
	return nil
}

func (t *Tokenizer) buildAdded(list []addedTokenJSON) error {
	t.addedByID = map[uint32]addedToken{}
	t.addedByContent = map[string]uint32{}
	var raw, norm []addedToken
	// HF keeps the last definition of a duplicated content; keep file order otherwise.
	for _, a := range list {
		at := addedToken{id: a.ID, content: a.Content, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip,
			normalized: a.Normalized == nil || *a.Normalized, special: a.Special, decoded: a.Content}
		if t.byteLevel {
			at.decoded = byteLevelDecode(a.Content)
		}
		if a.Content == "" {
			continue
		}
		t.addedByID[a.ID] = at
		t.addedByContent[a.Content] = a.ID
	}
	ids := make([]uint32, 0, len(t.addedByID))
	for id := range t.addedByID {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		at := t.addedByID[id]
		if at.normalized {
			// Normalized added tokens are matched on the normalized text, so match their normalized form.
			nc := at.content
			if t.norm != nil {
				nc = t.norm.normalize(nc)
			}
			at.match = nc
			norm = append(norm, at)
		} else {
			at.match = at.content
			raw = append(raw, at)
		}
	}
	t.rawAdded = newMatcher(raw)
	t.normAdded = newMatcher(norm)
	return nil
}

// configJSON is the part of tokenizer_config.json this package reads.
type configJSON struct {
	BOS json.RawMessage `json:"bos_token"`
	EOS json.RawMessage `json:"eos_token"`
}

func (t *Tokenizer) readConfig(data []byte) error {
	var c configJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("tokenizer: tokenizer_config.json: %w", err)
	}
	t.bosToken = tokenName(c.BOS)
	t.eosToken = tokenName(c.EOS)
	return nil
}

// tokenName reads a special-token entry of tokenizer_config.json: a string, an AddedToken object with a
// "content" member, or null.
func tokenName(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.Content
	}
	return ""
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
