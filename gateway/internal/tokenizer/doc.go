// Package tokenizer is an exact, pure-Go implementation of the Hugging Face `tokenizers` encode and decode
// pipeline for BPE models described by a `tokenizer.json` file: byte-level BPE (Qwen2/3, Llama-3.x,
// DeepSeek-V3) and Metaspace / byte-fallback BPE (Gemma-3, Llama-2).
//
// The output is byte-identical to HF's Rust tokenizers (npm `tokenizers@0.23.2`, the reference the goldens in
// testdata/goldens were generated with). The pipeline mirrors HF's:
//
//  1. added tokens (special or not) are matched leftmost-longest on the raw text, honouring lstrip, rstrip,
//     single_word and normalized;
//  2. the text between them is normalized (NFC, Prepend, Replace, ...);
//  3. pre-tokenized (a hand-written scanner for the Qwen2/3 and Llama-3 split pattern, dlclark/regexp2 for
//     any other pattern, Metaspace, ByteLevel);
//  4. each piece is run through BPE (merge ranks applied with a min-heap, leftmost pair first on ties,
//     ignore_merges, byte_fallback, unk with fuse_unk);
//  5. the post-processor adds special tokens (TemplateProcessing) when addSpecial is true.
//
// Components this package does not implement make Load fail with an *UnsupportedError naming them; Encode
// never fails. A Tokenizer is immutable after Load except for its bounded per-word cache, which is lock-free
// (a fixed array of seqlock-guarded atomic words), so it is safe for concurrent use by any number of
// goroutines.
//
// Token IDs are uint32, as in HF. Text is UTF-8; invalid UTF-8 in the input is replaced by U+FFFD before
// encoding (which is what a JSON decoder does to a request body anyway).
package tokenizer
