;; Call-stack metering: recursive functions leaving through every kind of exit Instrument accounts for
;; (the body's end, return, br / br_if / br_table to the function's label, br_table's default). Each
;; rec_*(n) returns n (rec_brtable recurses at most one level). If an exit forgot to give its frame's units back, repeated
;; calls would accumulate them and trap at MaxStackUnits (TestStackExits).
;; Built with: wat2wasm stack.wat -o stack.wasm (wabt 1.0.32)
(module
  (func $end (export "rec_end") (param $n i32) (result i32)
    (if (result i32) (i32.eqz (local.get $n))
      (then (i32.const 0))
      (else (i32.add (call $end (i32.sub (local.get $n) (i32.const 1))) (i32.const 1)))))
  (func $ret (export "rec_return") (param $n i32) (result i32)
    (if (i32.eqz (local.get $n)) (then (return (i32.const 0))))
    (return (i32.add (call $ret (i32.sub (local.get $n) (i32.const 1))) (i32.const 1))))
  (func $br (export "rec_br") (param $n i32) (result i32)
    (block $b
      (br_if $b (local.get $n))
      (i32.const 0)
      (br 1))
    (i32.add (call $br (i32.sub (local.get $n) (i32.const 1))) (i32.const 1)))
  (func $brif (export "rec_brif") (param $n i32) (result i32)
    (block $b
      (block $c
        (drop (br_if 2 (i32.const 0) (i32.eqz (local.get $n))))
        (drop (br_if 2 (i32.const 5) (i32.const 0)))))
    (i32.add (call $brif (i32.sub (local.get $n) (i32.const 1))) (i32.const 1)))
  (func $brtable (export "rec_brtable") (param $n i32) (result i32)
    ;; n % 3 = 0: entry 0, the function's label (returns n); 2: the default, the function's label too
    ;; (returns n); 1: entry 1, $b, then recursion (returns rec_brtable(n-1) + 1 = n).
    (drop (block $b (result i32)
      (br_table 1 0 1 (local.get $n) (i32.rem_u (local.get $n) (i32.const 3)))))
    (i32.add (call $brtable (i32.sub (local.get $n) (i32.const 1))) (i32.const 1)))
)
