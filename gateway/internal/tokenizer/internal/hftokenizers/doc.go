// Package hftokenizers is an optional tokenizer backend that calls Hugging Face's Rust tokenizers library
// through github.com/daulet/tokenizers (cgo). It implements tokenizer.Interface like the pure-Go
// gateway/internal/tokenizer, for cross-checking and for models using components the Go tokenizer does not
// implement.
//
// It is compiled only with the build tag hftokenizers and needs libtokenizers.a (built from the Rust crate
// or downloaded from daulet/tokenizers releases) on the linker path:
//
//	CGO_LDFLAGS="-L/path/to/lib" go build -tags hftokenizers ./...
//
// Without the tag the package is empty. `go vet -tags hftokenizers ./gateway/internal/tokenizer/...` type-checks it
// without the library: vet needs only the C header, which ships in the Go module.
package hftokenizers
