-- The store's epoch marker: KEYS[1] is set to ARGV[1] unless it exists; returns the marker's value.
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
