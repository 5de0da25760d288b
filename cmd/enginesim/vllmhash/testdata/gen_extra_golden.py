#!/usr/bin/env python3
"""Extra sha256_cbor / SGLang golden vectors for cmd/enginesim/vllmhash, computed the way vLLM and SGLang do
(cbor2 canonical + hashlib; same functions as ref/kv-events/gen_golden.py), over token IDs that exercise every
CBOR uint width and a longer seed. Run with /usr/bin/python3 (Debian python3-cbor2); writes extra_golden.json."""
import hashlib, json, os
import cbor2

def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()

TOKENS = [0, 23, 24, 255, 256, 65535, 65536, 151643, 4294967295, 7, 1, 2]
BS = 4
out = {"token_ids": TOKENS, "block_size": BS, "cases": []}
for seed, lora, salt in [("0", None, None), ("12345", None, None), ("0", "adapter-ü", None),
                         ("0", None, "s" * 30), ("0", "l", "s")]:
    nh = sha256_cbor(seed)
    parent, hs = nh, []
    for i in range(len(TOKENS) // BS):
        ex = ()
        if lora: ex += (lora,)
        if salt and i == 0: ex += (salt,)
        h = sha256_cbor((parent, tuple(TOKENS[i*BS:(i+1)*BS]), ex or None))
        hs.append(h.hex()); parent = h
    out["cases"].append({"seed": seed, "lora": lora or "", "cache_salt": salt or "", "block_hashes_hex": hs})
# SGLang, page size 4
prior, sg = None, []
for i in range(len(TOKENS) // BS):
    h = hashlib.sha256()
    if prior: h.update(bytes.fromhex(prior))
    for t in TOKENS[i*BS:(i+1)*BS]:
        h.update(t.to_bytes(4, "little"))
    prior = h.hexdigest(); sg.append(prior)
out["sglang_page_hashes_hex"] = sg
json.dump(out, open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "extra_golden.json"), "w"), indent=1)
