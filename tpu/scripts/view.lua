-- View (List, Inspect): the pool's state after reaping.
return {reaped, 'ok', redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4])}
