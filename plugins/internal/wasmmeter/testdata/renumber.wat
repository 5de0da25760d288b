;; Renumbering test module for wasmmeter: function imports, a start function, element segments of all
;; eight forms (flags 0..7), ref.func in a global initializer and in code, call_indirect on two tables,
;; exported functions, a loop and recursion, and a name section (built with --debug-names). wabt writes
;; a segment in the func-index form when it can, hence the ref.null in each expression segment.
;; Built with: wat2wasm --debug-names renumber.wat -o renumber.wasm (wabt 1.0.32)
(module
  (import "env" "add" (func $imp_add (param i32 i32) (result i32)))
  (import "env" "log" (func $imp_log (param i32)))
  (import "genv" "g" (global $gimp i32)) ;; from genv.wasm (value 2)
  (type $ii (func (param i32) (result i32)))
  (table $t 8 funcref)
  (table $t2 4 funcref)
  (memory (export "memory") 1)
  (global $started (mut i32) (i32.const 0))
  (global $fref funcref (ref.func $triple))
  (elem (i32.const 0) $double $triple)                         ;; flags 0: table 0, active, func indices
  (elem $pass func $inc $dec)                                  ;; flags 1: passive, func indices
  (elem (table $t2) (i32.const 0) func $square)                ;; flags 2: explicit table, func indices
  (elem declare func $declared)                                ;; flags 3: declarative, func indices
  (elem (i32.const 2) funcref (ref.func $inc) (ref.null func)) ;; flags 4: table 0, expressions
  (elem $pexpr funcref (ref.func $dec) (ref.null func))        ;; flags 5: passive, expressions
  (elem (table $t2) (i32.const 1) funcref (ref.func $double) (ref.null func)) ;; flags 6: explicit table, expressions
  (elem declare funcref (ref.func $declared2) (ref.null func)) ;; flags 7: declarative, expressions
  (start $start)
  (func $start
    (global.set $started (i32.add (global.get $gimp) (i32.const 40)))
    (call $imp_log (i32.const 1)))
  (func $double (type $ii) (i32.mul (local.get 0) (i32.const 2)))
  (func $triple (type $ii) (i32.mul (local.get 0) (i32.const 3)))
  (func $inc (type $ii) (i32.add (local.get 0) (i32.const 1)))
  (func $dec (type $ii) (i32.sub (local.get 0) (i32.const 1)))
  (func $square (type $ii) (i32.mul (local.get 0) (local.get 0)))
  (func $declared (type $ii) (i32.add (local.get 0) (i32.const 1000)))
  (func $declared2 (type $ii) (i32.add (local.get 0) (i32.const 2000)))
  (func (export "started") (result i32) (global.get $started))
  ;; call_indirect on table $t slot i with argument x
  (func $call_t (export "call_t") (param $i i32) (param $x i32) (result i32)
    (call_indirect $t (type $ii) (local.get $x) (local.get $i)))
  (func (export "call_t2") (param $i i32) (param $x i32) (result i32)
    (call_indirect $t2 (type $ii) (local.get $x) (local.get $i)))
  ;; copy the passive segments into $t slots 4,5 (func-index form) and 6,7 (expression form)
  (func (export "init_passive")
    (table.init $t $pass (i32.const 4) (i32.const 0) (i32.const 2))
    (table.init $t $pexpr (i32.const 6) (i32.const 0) (i32.const 2)))
  ;; the funcref global, called through slot 3
  (func (export "call_global") (param $x i32) (result i32)
    (table.set $t (i32.const 3) (global.get $fref))
    (call $call_t (i32.const 3) (local.get $x)))
  ;; ref.func in code (declared functions), called through slot 3
  (func (export "call_declared") (param $which i32) (param $x i32) (result i32)
    (table.set $t (i32.const 3)
      (select (result funcref) (ref.func $declared) (ref.func $declared2) (i32.eqz (local.get $which))))
    (call $call_t (i32.const 3) (local.get $x)))
  ;; sum of imp_add over 0..n-1 in a loop
  (func (export "sum") (param $n i32) (result i32) (local $i i32) (local $s i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $s (call $imp_add (local.get $s) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (local.get $s))
  (func $fib (export "fib") (param $n i32) (result i32)
    (if (result i32) (i32.lt_u (local.get $n) (i32.const 2))
      (then (local.get $n))
      (else (i32.add (call $fib (i32.sub (local.get $n) (i32.const 1)))
                     (call $fib (i32.sub (local.get $n) (i32.const 2)))))))
)
