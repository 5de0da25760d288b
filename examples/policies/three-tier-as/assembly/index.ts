// kvgate three-tier routing policy in AssemblyScript: a port of plugins/internal/threetier (DESIGN.md) against
// ABI v1 (plugins/ABI.md). It must rank every snapshot exactly like the Go version; main_test.go checks
// 10,000 random snapshots. Config: only the defaults (imbalance 8, match 0.10, CPU weight 0.8); a
// non-empty config other than "{}" is rejected with -3.

const BUF_CAP: i32 = 65536;
const BUF: usize = memory.data(BUF_CAP, 16);
const MAX: i32 = 1364; // (BUF_CAP - 64) / 48

// Scratch, one slot per healthy endpoint (parallel arrays), and the order being sorted.
const RATE: usize = memory.data(MAX * 8, 8);
const LOAD: usize = memory.data(MAX * 8, 8);
const KEY: usize = memory.data(MAX * 8, 8);
const IDX: usize = memory.data(MAX * 4, 4);
const GRP: usize = memory.data(MAX * 4, 4);
const ORD: usize = memory.data(MAX * 4, 4);

const IMBALANCE: f64 = 8.0;
const MATCH: f64 = 0.10;
const CPU_WEIGHT: f64 = 0.8;

const AFFINITY: i32 = 1;
const BALANCE: i32 = 2;
const MISS: i32 = 3;

const GOLDEN: u64 = 0x9e3779b97f4a7c15;

export function kvgate_policy_abi_v1(): void {}

export function kvgate_policy_abi_minor(): i32 {
  return 0;
}

export function kvgate_policy_buf(): i32 {
  return <i32>BUF;
}

export function kvgate_policy_buf_cap(): i32 {
  return BUF_CAP;
}

function isSpace(c: u32): bool {
  return c == 0x20 || c == 0x09 || c == 0x0a || c == 0x0d;
}

export function kvgate_policy_init(len: i32): i32 {
  if (len < 0 || len > BUF_CAP) return -1;
  // Accept "", whitespace and "{}" only.
  let i = 0;
  while (i < len && isSpace(load<u8>(BUF + i))) i++;
  if (i == len) return 0;
  if (load<u8>(BUF + i) != 0x7b) return -3;
  i++;
  while (i < len && isSpace(load<u8>(BUF + i))) i++;
  if (i == len || load<u8>(BUF + i) != 0x7d) return -3;
  i++;
  while (i < len && isSpace(load<u8>(BUF + i))) i++;
  return i == len ? 0 : -3;
}

// SplitMix64, as sdk.Rand / sdk.Mix64 / sdk.TieKey.
function mix64(x: u64): u64 {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

function tieKey(seed: u64, i: u32): u64 {
  return mix64(seed ^ ((<u64>i + 1) * GOLDEN));
}

let rng: u64 = 0;

function next(): u64 {
  rng += GOLDEN;
  return mix64(rng);
}

// High 64 bits of x·y (math/bits.Mul64).
function mulhi(x: u64, y: u64): u64 {
  const mask: u64 = 0xffffffff;
  const x0 = x & mask, x1 = x >> 32;
  const y0 = y & mask, y1 = y >> 32;
  const w0 = x0 * y0;
  const t = x1 * y0 + (w0 >> 32);
  let w1 = t & mask;
  const w2 = t >> 32;
  w1 += x0 * y1;
  return x1 * y1 + w2 + (w1 >> 32);
}

function intn(n: i32): i32 {
  return <i32>mulhi(next(), <u64>n);
}

// before mirrors threetier.before: one order for every branch.
function before(a: i32, b: i32, tier: i32): bool {
  const ga = load<u32>(GRP + (<usize>a << 2));
  const gb = load<u32>(GRP + (<usize>b << 2));
  if (tier != MISS && ga != gb) return ga < gb;
  if (tier == AFFINITY && ga == 0) {
    const ra = load<f64>(RATE + (<usize>a << 3));
    const rb = load<f64>(RATE + (<usize>b << 3));
    if (ra != rb) return ra > rb;
  }
  const la = load<u64>(LOAD + (<usize>a << 3));
  const lb = load<u64>(LOAD + (<usize>b << 3));
  if (la != lb) return la < lb;
  const ka = load<u64>(KEY + (<usize>a << 3));
  const kb = load<u64>(KEY + (<usize>b << 3));
  if (ka != kb) return ka < kb;
  return load<u32>(IDX + (<usize>a << 2)) < load<u32>(IDX + (<usize>b << 2));
}

export function kvgate_policy_choose(len: i32): i32 {
  if (len < 64 || len > BUF_CAP) return -1;
  if (load<u32>(BUF) != 0x5047564b) return -1;
  const hs = <i32>load<u16>(BUF + 6);
  const rs = <i32>load<u16>(BUF + 8);
  const n32 = load<u32>(BUF + 12);
  if (hs < 64 || rs < 48 || hs > len || n32 > <u32>((len - hs) / rs)) return -1;
  const n = <i32>n32;
  if (n > MAX) return -2;
  const tokens = load<u32>(BUF + 24);
  const blockSize = load<u32>(BUF + 32);
  const seed = load<u64>(BUF + 48);

  let m = 0;
  let minLoad: u64 = 0;
  for (let i = 0; i < n; i++) {
    const r = BUF + <usize>hs + <usize>i * <usize>rs;
    if ((load<u32>(r + 4) & 1) == 0) continue;
    const index = load<u32>(r);
    const ld: u64 = <u64>load<u32>(r + 16) + <u64>load<u32>(r + 24);
    let rate: f64 = 0;
    if (tokens != 0) {
      const credit: f64 = <f64>load<u32>(r + 8) + CPU_WEIGHT * <f64>load<u32>(r + 12);
      rate = (credit * <f64>blockSize) / <f64>tokens;
    }
    store<f64>(RATE + (<usize>m << 3), rate);
    store<u64>(LOAD + (<usize>m << 3), ld);
    store<u64>(KEY + (<usize>m << 3), tieKey(seed, index));
    store<u32>(IDX + (<usize>m << 2), index);
    store<u32>(GRP + (<usize>m << 2), 0);
    store<u32>(ORD + (<usize>m << 2), m);
    if (m == 0 || ld < minLoad) minLoad = ld;
    m++;
  }
  if (m == 0) return 0;

  let bestFree: f64 = -1.0;
  let bestOver: f64 = -1.0;
  for (let i = 0; i < m; i++) {
    const rate = load<f64>(RATE + (<usize>i << 3));
    if (<f64>(load<u64>(LOAD + (<usize>i << 3)) - minLoad) > IMBALANCE) {
      store<u32>(GRP + (<usize>i << 2), 1);
      if (rate > bestOver) bestOver = rate;
    } else if (rate > bestFree) {
      bestFree = rate;
    }
  }
  let tier = MISS;
  if (bestFree >= MATCH) {
    tier = AFFINITY;
  } else if (bestOver >= MATCH) {
    tier = BALANCE;
    rng = seed;
    const a = intn(m);
    let b = intn(m - 1);
    if (b >= a) b++;
    for (let i = 0; i < m; i++) store<u32>(GRP + (<usize>i << 2), 1);
    store<u32>(GRP + (<usize>a << 2), 0);
    store<u32>(GRP + (<usize>b << 2), 0);
  }

  // Insertion sort of ORD: before is a total order, so any correct sort gives Go's result.
  for (let i = 1; i < m; i++) {
    const x = load<i32>(ORD + (<usize>i << 2));
    let j = i;
    while (j > 0) {
      const y = load<i32>(ORD + (<usize>(j - 1) << 2));
      if (!before(x, y, tier)) break;
      store<i32>(ORD + (<usize>j << 2), y);
      j--;
    }
    store<i32>(ORD + (<usize>j << 2), x);
  }
  for (let k = 0; k < m; k++) {
    const p = load<i32>(ORD + (<usize>k << 2));
    store<u32>(BUF + (<usize>k << 2), load<u32>(IDX + (<usize>p << 2)));
  }
  return m;
}
