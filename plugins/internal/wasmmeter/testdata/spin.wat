;; A counting loop for BenchmarkLoopIteration: spin(n) runs n loop iterations and returns n.
;; Built with: wat2wasm spin.wat -o spin.wasm (wabt 1.0.32)
(module
  (func (export "spin") (param $n i32) (result i32) (local $i i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (local.get $i)))
