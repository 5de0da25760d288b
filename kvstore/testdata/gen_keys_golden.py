#!/usr/bin/env python3
"""Independent reference for kvgate block keys (kvstore.Hasher, layout v1).

Pure-Python XXH64 written from the xxHash specification (doc/xxhash_spec.md), checked against the
published XXH64 test values below, then the block-key definition from kvstore/hasher.go's doc comment.
Writes keys_golden.json next to this file. Run: python3 gen_keys_golden.py
"""
import json, os, struct

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)

def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M

def rnd(acc, lane):
    acc = (acc + lane * P2) & M
    return (rotl(acc, 31) * P1) & M

def merge(acc, v):
    acc ^= rnd(0, v)
    return (acc * P1 + P4) & M

def xxh64(data, seed=0):
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed & M, (seed - P1) & M]
        while i + 32 <= n:
            for j in range(4):
                v[j] = rnd(v[j], struct.unpack_from('<Q', data, i + 8 * j)[0])
            i += 32
        acc = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            acc = merge(acc, x)
    else:
        acc = (seed + P5) & M
    acc = (acc + n) & M
    while i + 8 <= n:
        acc ^= rnd(0, struct.unpack_from('<Q', data, i)[0])
        acc = (rotl(acc, 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        acc ^= (struct.unpack_from('<I', data, i)[0] * P1) & M
        acc = (rotl(acc, 23) * P2 + P3) & M
        i += 4
    while i < n:
        acc ^= (data[i] * P5) & M
        acc = (rotl(acc, 11) * P1) & M
        i += 1
    acc ^= acc >> 33
    acc = (acc * P2) & M
    acc ^= acc >> 29
    acc = (acc * P3) & M
    acc ^= acc >> 32
    return acc

# Published XXH64 values (xxHash sanity checks / common knowledge).
assert xxh64(b'') == 0xEF46DB3751D8E999
assert xxh64(b'a') == 0xD24EC4F1A98C6E5B
assert xxh64(b'abc') == 0x44BC2CF5AD770999
assert xxh64(b'Nobody inspects the spammish repetition') == 0xFBCEA83C8A378BF1

def keys(seed, tokens, bs, lora='', salt=''):
    out, parent = [], seed
    for b in range(len(tokens) // bs):
        data = struct.pack('<Q', parent) + b''.join(struct.pack('<I', t) for t in tokens[b * bs:(b + 1) * bs])
        if lora:
            lb = lora.encode()
            data += b'L' + struct.pack('<I', len(lb)) + lb
        if b == 0 and salt:
            sb = salt.encode()
            data += b'S' + struct.pack('<I', len(sb)) + sb
        parent = xxh64(data)
        out.append(parent)
    return out

cases = []
toks = [(i * 7919 + 13) % 151936 for i in range(70)]
for name, seed, bs, lora, salt, n in [
    ('plain_bs16', 0, 16, '', '', 70),
    ('seeded_bs16', 12345, 16, '', '', 64),
    ('lora_bs16', 0, 16, 'sql-lora', '', 48),
    ('salt_bs16', 0, 16, '', 'tenant-a', 48),
    ('lora_salt_bs4', 0xFFFFFFFFFFFFFFFF, 4, 'adapter', 'salt', 17),
    ('bs1', 7, 1, '', '', 5),
    ('partial_only', 0, 16, '', '', 15),
]:
    t = toks[:n]
    cases.append({'name': name, 'seed': str(seed), 'block_size': bs, 'lora': lora, 'cache_salt': salt,
                  'tokens': t, 'keys': [str(k) for k in keys(seed, t, bs, lora, salt)]})

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'keys_golden.json'), 'w') as f:
    json.dump({'definition': 'kvgate block keys v1, see kvstore/hasher.go', 'cases': cases}, f, indent=1)
    f.write('\n')
