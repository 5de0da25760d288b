-- Release. ARGV[1]: lease ID. Idempotent.
drop(ARGV[1])
return 0
