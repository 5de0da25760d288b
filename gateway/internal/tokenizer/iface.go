package tokenizer

// Interface is the tokenizer surface the rest of the gateway needs. *Tokenizer implements it; so does the
// optional cgo backend over HF's Rust library in gateway/internal/tokenizer/internal/hftokenizers (build tag hftokenizers).
type Interface interface {
	// Encode returns the token IDs of text; addSpecial adds the post-processor's special tokens.
	Encode(text string, addSpecial bool) []uint32
	// Decode returns the text of ids, special tokens included.
	Decode(ids []uint32) string
	// TokenID looks a token up in the added tokens and the vocab.
	TokenID(tok string) (uint32, bool)
}

var _ Interface = (*Tokenizer)(nil)
