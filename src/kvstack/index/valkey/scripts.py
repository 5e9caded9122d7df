"""The index's Lua scripts: each runs atomically on one slot (the registry's, or one bucket's).

Sent with ``EVAL`` (Valkey caches them by digest): nothing to reload after a failover.

- :data:`REGISTER` — a reset report: the engine's old local bits are retired, new ones
  allocated; its info, tiers and shared stores recorded; its report sequence set to 0.
- :data:`REFRESH` — any other report: ``resync`` if the epoch, the engine or the report
  sequence is not what the reporter expects (a lost write, a flushed or failed-over Valkey, an
  expiry); else the engine's last report time, info and tiers, and bits for new tiers.
- :data:`COMMIT` — after a report's entries are written: the engine's report sequence.
- :data:`APPLY` — set or clear one location's bit in up to a batch of chunk entries of one
  bucket, keeping that location's set of held chunks (for cleanup) in step.
- :data:`STATE` — the registry version, the server time and every engine's last report time.
- :data:`EXPIRE` — forget engines silent past the TTL (and shared stores no live engine reads
  any more), retiring their bits; lists retired bits old enough to clean.
- :data:`CLEAN` — clear a retired bit from up to a batch of entries of one bucket.
- :data:`FREE` — a retired bit, cleaned from every bucket, becomes free for reuse.

Bits are reused only after a quarantine (``ARGV`` of :data:`EXPIRE`) and a full cleanup, so a
report in flight with an engine's old bits never marks chunks for a new owner.
"""

from __future__ import annotations

__all__ = ["APPLY", "CLEAN", "COMMIT", "EXPIRE", "FREE", "REFRESH", "REGISTER", "STATE"]

# Shared by the registry scripts: KEYS are layout.REGISTRY_FIELDS, in order.
_PRELUDE = """
local E, V, I, T, L, U, Q, S, H, O, N, F, X = unpack(KEYS, 1, 13)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function retire(bit)
  redis.call('HDEL', O, bit)
  redis.call('ZADD', X, now, bit)
end
local function alloc(owner)
  local bit = redis.call('SPOP', F)
  if not bit then bit = tostring(redis.call('INCR', N) - 1) end
  redis.call('HSET', O, bit, owner)
  return tonumber(bit)
end
local function shared_bits(locations)
  local bits, grew = {}, false
  for _, loc in ipairs(locations) do
    local bit = redis.call('HGET', H, loc)
    if not bit then
      bit = alloc('\\0' .. loc)
      redis.call('HSET', H, loc, bit)
      grew = true
    end
    bits[loc] = tonumber(bit)
  end
  return bits, grew
end
"""

# ARGV: instance, info, tiers, local tier names (JSON), shared stores (JSON), new epoch
REGISTER = (
    _PRELUDE
    + """
local inst = ARGV[1]
redis.call('SET', E, ARGV[6], 'NX')
local epoch = redis.call('GET', E)
local old = redis.call('HGET', L, inst)
if old then
  for _, bit in pairs(cjson.decode(old)) do retire(bit) end
end
local bits = {}
for _, tier in ipairs(cjson.decode(ARGV[4])) do bits[tier] = alloc(inst .. '\\0' .. tier) end
local shared = shared_bits(cjson.decode(ARGV[5]))
redis.call('HSET', I, inst, ARGV[2])
redis.call('HSET', T, inst, ARGV[3])
redis.call('HSET', L, inst, cjson.encode(bits))
redis.call('HSET', U, inst, ARGV[5])
redis.call('HSET', Q, inst, '0')
redis.call('ZADD', S, now, inst)
redis.call('INCR', V)
return {'ok', epoch, cjson.encode(bits), cjson.encode(shared), '0'}
"""
)

# ARGV: instance, info, tiers ('' keeps them), local tier names (JSON), shared stores (JSON),
#       new epoch, the reporter's epoch, the expected report sequence ('*': not checked)
REFRESH = (
    _PRELUDE
    + """
local inst = ARGV[1]
local epoch = redis.call('GET', E)
if not epoch then
  redis.call('SET', E, ARGV[6])
  return {'resync', ARGV[6]}
end
if epoch ~= ARGV[7] or redis.call('HEXISTS', I, inst) == 0 then return {'resync', epoch} end
if ARGV[8] ~= '*' and redis.call('HGET', Q, inst) ~= ARGV[8] then return {'resync', epoch} end
local known = redis.call('HGET', L, inst)
if not known then return {'resync', epoch} end
redis.call('ZADD', S, now, inst)
local changed = false
if redis.call('HGET', I, inst) ~= ARGV[2] then
  redis.call('HSET', I, inst, ARGV[2])
  changed = true
end
if ARGV[3] ~= '' and redis.call('HGET', T, inst) ~= ARGV[3] then
  redis.call('HSET', T, inst, ARGV[3])
  redis.call('HSET', U, inst, ARGV[5])
  changed = true
end
local bits, grew = cjson.decode(known), false
for _, tier in ipairs(cjson.decode(ARGV[4])) do
  if not bits[tier] then
    bits[tier] = alloc(inst .. '\\0' .. tier)
    grew = true
  end
end
if grew then redis.call('HSET', L, inst, cjson.encode(bits)) end
local shared, shared_grew = shared_bits(cjson.decode(ARGV[5]))
if changed or grew or shared_grew then redis.call('INCR', V) end
return {'ok', epoch, cjson.encode(bits), cjson.encode(shared), redis.call('HGET', Q, inst) or '0'}
"""
)

# KEYS: I, Q. ARGV: instance, sequence
COMMIT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return 1
"""

# KEYS: the location's set of held chunks of this bucket. ARGV: bit, '1' (stored) or '0'
# (removed), length of the entries' name prefix, then the chunk entries (all of this bucket's
# slot: only the set is declared, so that a cluster client routes by one key, not 1,024).
APPLY = """
local bit, held, skip = tonumber(ARGV[1]), KEYS[1], tonumber(ARGV[3])
local n = 0
if ARGV[2] == '1' then
  for i = 4, #ARGV do
    if redis.call('SETBIT', ARGV[i], bit, 1) == 0 then
      n = n + 1
      redis.call('SADD', held, string.sub(ARGV[i], skip + 1))
    end
  end
else
  for i = 4, #ARGV do
    local k = ARGV[i]
    if redis.call('GETBIT', k, bit) == 1 then
      n = n + 1
      redis.call('SETBIT', k, bit, 0)
      redis.call('SREM', held, string.sub(k, skip + 1))
      if redis.call('BITCOUNT', k) == 0 then redis.call('DEL', k) end
    end
  end
end
return n
"""

# KEYS: V, S
STATE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('GET', KEYS[1]) or '0', now, redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')}
"""

# ARGV: ttl in ms, quarantine of retired bits in ms
EXPIRE = (
    _PRELUDE
    + """
local gone = redis.call('ZRANGEBYSCORE', S, '-inf', '(' .. (now - tonumber(ARGV[1])))
for _, inst in ipairs(gone) do
  local old = redis.call('HGET', L, inst)
  if old then
    for _, bit in pairs(cjson.decode(old)) do retire(bit) end
  end
  for _, key in ipairs({I, T, L, U, Q}) do redis.call('HDEL', key, inst) end
  redis.call('ZREM', S, inst)
end
if #gone > 0 then
  local used = {}
  for _, stores in ipairs(redis.call('HVALS', U)) do
    for _, loc in ipairs(cjson.decode(stores)) do used[loc] = true end
  end
  local shared = redis.call('HGETALL', H)
  for i = 1, #shared, 2 do
    if not used[shared[i]] then
      retire(shared[i + 1])
      redis.call('HDEL', H, shared[i])
    end
  end
  redis.call('INCR', V)
end
return {gone, redis.call('ZRANGEBYSCORE', X, '-inf', '(' .. (now - tonumber(ARGV[2])))}
"""
)

# KEYS: the retired location's set of held chunks of one bucket.
# ARGV: bit, the bucket's entry name prefix, batch size
CLEAN = """
local bit = tonumber(ARGV[1])
for _, key in ipairs(redis.call('SPOP', KEYS[1], tonumber(ARGV[3]))) do
  local k = ARGV[2] .. key
  if redis.call('GETBIT', k, bit) == 1 then
    redis.call('SETBIT', k, bit, 0)
    if redis.call('BITCOUNT', k) == 0 then redis.call('DEL', k) end
  end
end
return redis.call('SCARD', KEYS[1])
"""

# KEYS: X, F. ARGV: bit
FREE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then redis.call('SADD', KEYS[2], ARGV[1]) end
return 1
"""
