;; Bulk memory operations for wasmmeter: their length is charged as fuel (one unit per KiB).
;; fill(n) runs n loop iterations of a 64 KiB memory.fill and memory.copy; forever() fills 8 MiB
;; in an endless loop (8 MiB per fill: one fill is not interruptible, the test bounds the overrun).
;; Built with: wat2wasm bulk.wat -o bulk.wasm (wabt 1.0.32)
(module
  (memory 512)
  (func (export "fill") (param $n i32) (result i32) (local $i i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (memory.fill (i32.const 0) (local.get $i) (i32.const 65536))
        (memory.copy (i32.const 65536) (i32.const 0) (i32.const 65536))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (i32.load8_u (i32.const 65537)))
  (func (export "forever")
    (loop $l
      (memory.fill (i32.const 0) (i32.const 1) (i32.const 8388608))
      (br $l)))
)
