-- Release. ARGV[1]: lease ID. Idempotent. No clock and no reap: a release frees only its own lease (expired
-- leases are reaped where they matter, by a Reserve whose limit check fails, Renew and the in-flight script).
drop(ARGV[1])
return 0
